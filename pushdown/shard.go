package pushdown

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// Shard is one replica's local data (head and local blocks), evaluated
// where it lives.
type Shard interface {
	// Name identifies the shard in warnings ("peer host:port").
	Name() string
	// Eval evaluates req over the shard's data of the tenant in ctx. An
	// error wrapping ErrUnavailable means the shard could not answer (its
	// data is then missing, with a warning); any other error makes the
	// caller evaluate the part over the merged fleet instead.
	Eval(ctx context.Context, req Request) (*Result, error)
}

// ErrUnavailable marks a shard that could not be reached or was not ready.
var ErrUnavailable = errors.New("shard unavailable")

// Request is one part of a query, at the query's times.
type Request struct {
	Query      string
	Start, End time.Time
	Step       time.Duration // 0: an instant query at Start
	// Lookback is the query's lookback delta; 0 is the engine's default.
	Lookback time.Duration
}

// Result is a shard's answer to a Request.
type Result struct {
	Series []promql.Series
	// Keys are the distinct cluster label values of every series the
	// evaluation read, "" standing for series without the label. Disjoint
	// keys across shards are what make their answers combinable.
	Keys []string
	// Warnings and Infos are the evaluation's annotations, as text.
	Warnings, Infos []string
}

// Evaluate answers req with engine over q (one shard's data; the tenant is
// read from ctx by q), recording the cluster keys of the series read.
func Evaluate(ctx context.Context, engine promql.QueryEngine, q promstorage.Queryable, clusterLabel string, req Request) (*Result, error) {
	rec := &recorder{Queryable: q, label: clusterLabel, keys: map[string]struct{}{}}
	var (
		qry promql.Query
		err error
	)
	var opts promql.QueryOpts
	if req.Lookback > 0 {
		opts = promql.NewPrometheusQueryOpts(false, req.Lookback, nil)
	}
	if req.Step == 0 {
		qry, err = engine.NewInstantQuery(ctx, rec, opts, req.Query, req.Start)
	} else {
		qry, err = engine.NewRangeQuery(ctx, rec, opts, req.Query, req.Start, req.End, req.Step)
	}
	if err != nil {
		return nil, err
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		return nil, res.Err
	}
	out := &Result{Series: copySeries(res.Value)}
	out.Warnings, out.Infos = res.Warnings.AsStrings(req.Query, 0, 0)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for k := range rec.keys {
		out.Keys = append(out.Keys, k)
	}
	slices.Sort(out.Keys)
	return out, nil
}

// copySeries copies a vector or matrix out of the query's pooled memory.
func copySeries(v parser.Value) []promql.Series {
	switch v := v.(type) {
	case promql.Vector:
		out := make([]promql.Series, 0, len(v))
		for _, s := range v {
			ps := promql.Series{Metric: s.Metric}
			if s.H != nil {
				ps.Histograms = []promql.HPoint{{T: s.T, H: s.H.Copy()}}
			} else {
				ps.Floats = []promql.FPoint{{T: s.T, F: s.F}}
			}
			out = append(out, ps)
		}
		return out
	case promql.Matrix:
		out := make([]promql.Series, 0, len(v))
		for _, s := range v {
			ps := promql.Series{Metric: s.Metric, Floats: slices.Clone(s.Floats)}
			for _, h := range s.Histograms {
				ps.Histograms = append(ps.Histograms, promql.HPoint{T: h.T, H: h.H.Copy()})
			}
			out = append(out, ps)
		}
		return out
	}
	return nil // parts are vectors; plan never pushes down anything else
}

// recorder notes the cluster key of every series selected through it.
type recorder struct {
	promstorage.Queryable
	label string

	mu   sync.Mutex
	keys map[string]struct{}
}

func (r *recorder) Querier(mint, maxt int64) (promstorage.Querier, error) {
	q, err := r.Queryable.Querier(mint, maxt)
	if err != nil {
		return nil, err
	}
	return recordingQuerier{Querier: q, r: r}, nil
}

type recordingQuerier struct {
	promstorage.Querier
	r *recorder
}

func (q recordingQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	return &recordingSet{SeriesSet: q.Querier.Select(ctx, sortSeries, hints, ms...), r: q.r, seen: map[string]struct{}{}}
}

type recordingSet struct {
	promstorage.SeriesSet
	r    *recorder
	seen map[string]struct{}
}

func (s *recordingSet) Next() bool {
	if !s.SeriesSet.Next() {
		s.flush()
		return false
	}
	k := s.SeriesSet.At().Labels().Get(s.r.label)
	if _, ok := s.seen[k]; !ok {
		s.seen[k] = struct{}{}
	}
	return true
}

func (s *recordingSet) flush() {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	for k := range s.seen {
		s.r.keys[k] = struct{}{}
	}
	clear(s.seen)
}

// annotation is a shard's annotation, as text, keeping its kind.
type annotation struct {
	msg  string
	info bool
}

func (a annotation) Error() string { return a.msg }

func (a annotation) Is(target error) bool {
	if a.info {
		return target == annotations.PromQLInfo
	}
	return target == annotations.PromQLWarning
}

func (r *Result) annotations() annotations.Annotations {
	var as annotations.Annotations
	for _, w := range r.Warnings {
		as.Add(annotation{msg: w})
	}
	for _, i := range r.Infos {
		as.Add(annotation{msg: i, info: true})
	}
	return as
}
