package query

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// The label calls of the Prometheus HTTP API, as NewLabelHandler serves them.
const (
	LabelNamesPath  = "/api/v1/labels"
	LabelValuesPath = "/api/v1/label/{name}/values"
)

// NewLabelHandler serves the label calls (GET and POST LabelNamesPath and
// LabelValuesPath) over r for the tenant of the request (auth.Middleware in
// front), through Prometheus' own handlers: the same parameters (match[],
// start, end, limit), errors and JSON as NewHandler's. One difference: under
// limit, the values returned are the lexically smallest of r's
// (promstorage.LabelHints.LimitSmallest), not any, so that a caller merging
// several such answers, each the first limit of its own, holds the first
// limit of their union. Any other path is 404. ready nil means always.
func NewLabelHandler(logger *slog.Logger, r Reader, ready func() bool) http.Handler {
	// No engine: only the label calls are routed to the API.
	api := NewHandler(logger, nil, smallestFirst{r}, Options{Ready: ready})
	mux := http.NewServeMux()
	mux.Handle(LabelNamesPath, api)
	mux.Handle(LabelValuesPath, api)
	return mux
}

// smallestFirst is r with every label call under a limit asking for the
// lexically smallest values.
type smallestFirst struct{ r Reader }

func (s smallestFirst) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	q, err := s.r.Querier(tenant, mint, maxt)
	if err != nil {
		return nil, err
	}
	return LimitSmallest(q), nil
}

// LimitSmallest returns q with every label call under a limit asking for
// the lexically smallest values (promstorage.LabelHints.LimitSmallest)
// rather than any: over a merge, the answer is then the first of the union.
func LimitSmallest(q promstorage.Querier) promstorage.Querier { return smallestQuerier{q} }

type smallestQuerier struct{ promstorage.Querier }

func (q smallestQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return q.Querier.LabelValues(ctx, name, smallest(hints), ms...)
}

func (q smallestQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return q.Querier.LabelNames(ctx, smallest(hints), ms...)
}

func smallest(hints *promstorage.LabelHints) *promstorage.LabelHints {
	if hints == nil || hints.Limit <= 0 {
		return hints
	}
	h := *hints
	h.LimitSmallest = true
	return &h
}
