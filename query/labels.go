package query

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// The calls of the Prometheus HTTP API answered from the index alone (no
// samples), as NewIndexHandler serves them.
const (
	LabelNamesPath  = "/api/v1/labels"
	LabelValuesPath = "/api/v1/label/{name}/values"
	SeriesPath      = "/api/v1/series"
)

// IndexPaths returns the paths NewIndexHandler serves (a new slice each
// time: callers may not change what it serves).
func IndexPaths() []string { return []string{LabelNamesPath, LabelValuesPath, SeriesPath} }

// NewIndexHandler serves the label calls and the series call (GET and POST
// IndexPaths) over r for the tenant of the request (auth.Middleware in
// front), through Prometheus' own handlers: the same parameters (match[],
// start, end, limit), errors and JSON as NewHandler's. One difference: under
// limit, the values and series returned are the smallest of r's (values
// lexically, series in label order), not any, so that a caller merging
// several such answers, each the first limit of its own, holds the first
// limit of their union. Any other path is 404. ready nil means always.
func NewIndexHandler(logger *slog.Logger, r Reader, ready func() bool) http.Handler {
	// No engine: only the index calls are routed to the API.
	api := NewHandler(logger, nil, smallestFirst{r}, Options{Ready: ready})
	mux := http.NewServeMux()
	for _, p := range IndexPaths() {
		mux.Handle(p, api)
	}
	return mux
}

// smallestFirst is r with every index call under a limit asking for the
// smallest values or series.
type smallestFirst struct{ r Reader }

func (s smallestFirst) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	q, err := s.r.Querier(tenant, mint, maxt)
	if err != nil {
		return nil, err
	}
	return LimitSmallest(q), nil
}

// LimitSmallest returns q with every index call under a limit asking for
// the smallest answers rather than any: label calls the lexically smallest
// values (promstorage.LabelHints.LimitSmallest), series calls (Select with
// hints.Func "series") the series sorted, which the API cuts at the limit.
// Over a merge, the answer is then the first of the union.
func LimitSmallest(q promstorage.Querier) promstorage.Querier { return smallestQuerier{q} }

type smallestQuerier struct{ promstorage.Querier }

func (q smallestQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return q.Querier.LabelValues(ctx, name, smallest(hints), ms...)
}

func (q smallestQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return q.Querier.LabelNames(ctx, smallest(hints), ms...)
}

func (q smallestQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	// The API asks for them unsorted under one match[]: the head's are then
	// in creation order, and the limit would keep any.
	if hints != nil && hints.Func == "series" && hints.Limit > 0 {
		sortSeries = true
	}
	return q.Querier.Select(ctx, sortSeries, hints, ms...)
}

func smallest(hints *promstorage.LabelHints) *promstorage.LabelHints {
	if hints == nil || hints.Limit <= 0 {
		return hints
	}
	h := *hints
	h.LimitSmallest = true
	return &h
}
