// Package pushdown evaluates fleet queries where the data lives.
//
// Replicas shard the fleet by cluster: each holds whole clusters in its
// head. A query over the merged view pulls every selected series from every
// peer (remote read) and evaluates them in one place, which costs the
// transfer and decoding of every series. Most fleet queries are instead
// aggregations over expressions whose series each depend on one cluster —
// count by (version) (csv_succeeded), count by (_id) ({...}),
// max by (_id, version) (...) — and those can be evaluated on each replica's
// own data and combined: sum for count and sum, min, max, group, and the
// plain union for expressions that keep clusters apart. Engine does that,
// and only when it is exact:
//
//   - the query's data must lie outside every bucket block, so that the
//     replicas' local data is the whole fleet's;
//   - the shards must hold disjoint clusters for the part: each reports the
//     cluster label values of the series it read, and any value seen on two
//     shards (a cluster moved between replicas, series without the label on
//     more than one) sends the part to the merged evaluation, as without
//     pushdown.
//
// A shard that cannot be reached is a warning and its data is missing, as
// for a failed remote read.
package pushdown

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/prometheus/prometheus/util/stats"
)

// Options configure an Engine.
type Options struct {
	// ClusterLabel is the label that shards the fleet (_id).
	ClusterLabel string
	// Local is this replica's local data (head and local blocks), scoped to
	// the tenant of the query's context.
	Local promstorage.Queryable
	// Peers returns the other replicas; none means no pushdown.
	Peers func() []Shard
	// InBucket reports whether the tenant of ctx has bucket blocks with
	// data between mint and maxt; nil means there is no bucket.
	InBucket func(ctx context.Context, mint, maxt int64) bool
	// LookbackDelta is the engine's lookback (5m when zero).
	LookbackDelta time.Duration
	// Timeout bounds a pushed-down query as a whole: its parts on every
	// shard, any merged fallback and the outer query share it, as one query
	// of the inner engine has its timeout. Zero: only the inner engine's
	// timeout per evaluation.
	Timeout time.Duration
}

// Engine is a promql.QueryEngine that pushes query parts down to the
// shards when it can and otherwise is inner.
type Engine struct {
	inner  promql.QueryEngine
	logger *slog.Logger
	opts   Options
	parser parser.Parser
	local  Shard

	queries *prometheus.CounterVec
	parts   *prometheus.CounterVec
}

// New wraps inner. reg may be nil.
func New(logger *slog.Logger, reg prometheus.Registerer, inner promql.QueryEngine, opts Options) *Engine {
	if opts.LookbackDelta == 0 {
		opts.LookbackDelta = 5 * time.Minute
	}
	f := promauto.With(reg)
	e := &Engine{
		inner: inner, logger: logger, opts: opts,
		parser: parser.NewParser(parser.Options{}),
		queries: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_query_pushdown_queries_total",
			Help: "Queries with parts that can be evaluated on each replica, by outcome: pushed (to the replicas), bucket (the range reaches bucket blocks: merged evaluation).",
		}, []string{"outcome"}),
		parts: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_query_pushdown_parts_total",
			Help: "Query parts sent to the replicas, by outcome: pushed (combined from the replicas' answers), overlap (a cluster on more than one replica: merged evaluation), error (a replica failed the part: merged evaluation).",
		}, []string{"outcome"}),
	}
	e.local = localShard{e: e}
	for _, o := range []string{"pushed", "bucket"} {
		e.queries.WithLabelValues(o)
	}
	for _, o := range []string{"pushed", "overlap", "error"} {
		e.parts.WithLabelValues(o)
	}
	return e
}

// NewInstantQuery implements promql.QueryEngine.
func (e *Engine) NewInstantQuery(ctx context.Context, q promstorage.Queryable, opts promql.QueryOpts, qs string, ts time.Time) (promql.Query, error) {
	if pq := e.plan(q, opts, qs, ts, ts, 0); pq != nil {
		return pq, nil
	}
	return e.inner.NewInstantQuery(ctx, q, opts, qs, ts)
}

// NewRangeQuery implements promql.QueryEngine.
func (e *Engine) NewRangeQuery(ctx context.Context, q promstorage.Queryable, opts promql.QueryOpts, qs string, start, end time.Time, step time.Duration) (promql.Query, error) {
	if pq := e.plan(q, opts, qs, start, end, step); pq != nil {
		return pq, nil
	}
	return e.inner.NewRangeQuery(ctx, q, opts, qs, start, end, step)
}

// plan returns the pushed-down query, or nil to leave qs to inner (which
// also reports any parse error).
func (e *Engine) plan(q promstorage.Queryable, opts promql.QueryOpts, qs string, start, end time.Time, step time.Duration) *query {
	if e.opts.Peers == nil {
		return nil
	}
	expr, err := e.parser.ParseExpr(qs)
	if err != nil {
		return nil
	}
	lookback := e.opts.LookbackDelta
	if opts != nil && opts.LookbackDelta() > 0 {
		lookback = opts.LookbackDelta()
	}
	stmt := &parser.EvalStmt{Expr: expr, Start: start, End: end, Interval: step, LookbackDelta: lookback}
	mint, maxt := promql.FindMinMaxTime(stmt)
	// plan rewrites the tree it is given: the statement keeps its own.
	rewritten, _ := e.parser.ParseExpr(qs)
	outer, parts := plan(rewritten, e.opts.ClusterLabel)
	if len(parts) == 0 {
		return nil
	}
	return &query{
		e: e, fleet: q, opts: opts, stmt: stmt, qs: qs, outer: outer.String(), parts: parts,
		mint: mint, maxt: maxt,
	}
}

// query is a query with parts to push down.
type query struct {
	e          *Engine
	fleet      promstorage.Queryable
	opts       promql.QueryOpts
	stmt       *parser.EvalStmt
	qs, outer  string
	parts      []part
	mint, maxt int64

	mu     sync.Mutex
	run    promql.Query // what Exec evaluated last; its stats and memory
	cancel context.CancelFunc
}

func (q *query) request(expr string) Request {
	req := Request{Query: expr, Start: q.stmt.Start, End: q.stmt.End, Step: q.stmt.Interval}
	if q.opts != nil && q.opts.LookbackDelta() > 0 {
		req.Lookback = q.opts.LookbackDelta()
	}
	return req
}

// newInner is an inner query of expr over data at the query's times.
func (q *query) newInner(ctx context.Context, data promstorage.Queryable, expr string) (promql.Query, error) {
	if q.stmt.Interval == 0 {
		return q.e.inner.NewInstantQuery(ctx, data, q.opts, expr, q.stmt.Start)
	}
	return q.e.inner.NewRangeQuery(ctx, data, q.opts, expr, q.stmt.Start, q.stmt.End, q.stmt.Interval)
}

func (q *query) Exec(ctx context.Context) *promql.Result {
	ctx, cancel := context.WithCancel(ctx) // Cancel's: it ends the timeout's too
	defer cancel()
	if t := q.e.opts.Timeout; t > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, t)
		defer stop()
	}
	q.mu.Lock()
	q.cancel = cancel
	q.mu.Unlock()

	expr, data := q.qs, q.fleet
	var ws annotations.Annotations
	if q.e.opts.InBucket != nil && q.e.opts.InBucket(ctx, q.mint, q.maxt) {
		q.e.queries.WithLabelValues("bucket").Inc()
	} else {
		q.e.queries.WithLabelValues("pushed").Inc()
		parts, pws, err := q.evalParts(ctx)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return &promql.Result{Err: promql.ErrQueryTimeout("pushed-down parts")} // as the inner engine reports it
		}
		if err != nil {
			return &promql.Result{Err: err}
		}
		expr, data, ws = q.outer, synthetic{parts: parts, base: q.fleet}, pws
	}
	qry, err := q.newInner(ctx, data, expr)
	if err != nil {
		return &promql.Result{Err: err}
	}
	q.mu.Lock()
	q.run = qry
	q.mu.Unlock()
	res := qry.Exec(ctx)
	res.Warnings.Merge(ws)
	return res
}

// evalParts evaluates every part, concurrently, into the series the outer
// query selects by the part's name.
func (q *query) evalParts(ctx context.Context) (map[string][]promstorage.Series, annotations.Annotations, error) {
	peers := q.e.opts.Peers()
	out := make(map[string][]promstorage.Series, len(q.parts))
	var (
		mu       sync.Mutex
		ws       annotations.Annotations
		firstErr error
		wg       sync.WaitGroup
	)
	for _, p := range q.parts {
		wg.Go(func() {
			series, pws, err := q.evalPart(ctx, p, peers)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			out[p.name] = series
			ws.Merge(pws)
		})
	}
	wg.Wait()
	return out, ws, firstErr
}

// evalPart evaluates p on this replica and every peer and combines their
// answers, or evaluates it over the merged fleet when that is not exact.
func (q *query) evalPart(ctx context.Context, p part, peers []Shard) ([]promstorage.Series, annotations.Annotations, error) {
	shards := append([]Shard{q.e.local}, peers...)
	results := make([]*Result, len(shards))
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for i, s := range shards {
		wg.Go(func() { results[i], errs[i] = s.Eval(ctx, q.request(p.expr)) })
	}
	wg.Wait()
	if errs[0] != nil { // this replica's own data: as for the merged view, its errors fail the query
		return nil, nil, errs[0]
	}
	var ws annotations.Annotations
	owner := map[string]int{}
	for i, r := range results {
		switch err := errs[i]; {
		case err != nil && isUnavailable(err):
			ws.Add(fmt.Errorf("%s unavailable, its data is missing: %w", shards[i].Name(), err))
			continue
		case err != nil:
			q.e.parts.WithLabelValues("error").Inc()
			q.e.logger.Debug("pushdown failed on a replica, evaluating over the merged fleet", "replica", shards[i].Name(), "err", err)
			return q.merged(ctx, p)
		}
		for _, k := range r.Keys {
			if j, ok := owner[k]; ok && j != i {
				q.e.parts.WithLabelValues("overlap").Inc()
				return q.merged(ctx, p)
			}
			owner[k] = i
		}
		ws.Merge(r.annotations())
	}
	q.e.parts.WithLabelValues("pushed").Inc()
	var series []promstorage.Series
	for i, r := range results {
		if r != nil {
			series = q.appendSeries(series, r.Series, p.combine, i)
		}
	}
	return series, ws, nil
}

// merged evaluates p over the merged fleet, the answer without pushdown,
// with the merged evaluation's warnings only (a peer that is down is
// reported by it once).
func (q *query) merged(ctx context.Context, p part) ([]promstorage.Series, annotations.Annotations, error) {
	qry, err := q.newInner(ctx, q.fleet, p.expr)
	if err != nil {
		return nil, nil, err
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		return nil, nil, res.Err
	}
	return q.appendSeries(nil, copySeries(res.Value), p.combine, 0), res.Warnings, nil
}

// appendSeries appends a shard's answer as stored series: labelled with
// the shard when partial aggregates are combined, and with a stale marker
// at every step a series is absent after its first, so that the outer
// query's lookback does not carry its previous value over the gap.
func (q *query) appendSeries(dst []promstorage.Series, src []promql.Series, combine bool, shard int) []promstorage.Series {
	for _, s := range src {
		if combine {
			b := labels.NewBuilder(s.Metric)
			b.Set(ShardLabel, fmt.Sprint(shard))
			s.Metric = b.Labels()
		}
		if q.stmt.Interval > 0 {
			s.Floats = withStaleMarkers(s, q.stmt.Start.UnixMilli(), q.stmt.End.UnixMilli(), q.stmt.Interval.Milliseconds())
		}
		dst = append(dst, promql.NewStorageSeries(s))
	}
	return dst
}

// withStaleMarkers returns s's floats with a stale marker at every step
// from its first sample to end that has neither a float nor a histogram.
func withStaleMarkers(s promql.Series, start, end, step int64) []promql.FPoint {
	present := make(map[int64]struct{}, len(s.Floats)+len(s.Histograms))
	first := int64(math.MaxInt64)
	for _, p := range s.Floats {
		present[p.T] = struct{}{}
		first = min(first, p.T)
	}
	for _, p := range s.Histograms {
		present[p.T] = struct{}{}
		first = min(first, p.T)
	}
	out := s.Floats
	stale := math.Float64frombits(value.StaleNaN)
	for t := start; t <= end; t += step {
		if _, ok := present[t]; !ok && t > first {
			out = append(out, promql.FPoint{T: t, F: stale})
		}
	}
	slices.SortFunc(out, func(a, b promql.FPoint) int { return cmp.Compare(a.T, b.T) })
	return out
}

func isUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

func (q *query) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.run != nil {
		q.run.Close()
	}
}

func (q *query) Statement() parser.Statement { return q.stmt }

func (q *query) Stats() *stats.Statistics {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.run != nil {
		return q.run.Stats()
	}
	return &stats.Statistics{Timers: stats.NewQueryTimers(), Samples: stats.NewQuerySamples(false)}
}

func (q *query) Cancel() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cancel != nil {
		q.cancel()
	}
}

func (q *query) String() string { return q.qs }

// localShard is this replica's own local data.
type localShard struct{ e *Engine }

func (localShard) Name() string { return "this replica" }

func (s localShard) Eval(ctx context.Context, req Request) (*Result, error) {
	return Evaluate(ctx, s.e.inner, s.e.opts.Local, s.e.opts.ClusterLabel, req)
}
