package pushdown

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"
	"github.com/prometheus/prometheus/util/teststorage"
	"github.com/stretchr/testify/require"
)

// queries cover the fleet dashboards and rules, and the shapes plan must
// leave to the merged evaluation (or push only in part).
var queries = []string{
	`count by (name, version) (csv_succeeded)`,
	`count by (name, version, phase, reason) (max_over_time(csv_abnormal[15m]))`,
	`sum by (name) (csv_succeeded)`,
	`sum without (version) (csv_succeeded)`,
	`max by (_id, version) (cluster_version)`,
	`count by (_id) ({_id!=""})`,
	`count(csv_succeeded)`,
	`min by (version) (csv_succeeded)`,
	`group by (name) (csv_succeeded)`,
	`quantile(0.5, count by (_id) ({_id!=""}))`,
	`count by (name, version) (group by (_id, name, version) (max_over_time(csv_succeeded[15m])) or group by (_id, name, version) (max_over_time(csv_abnormal[15m])))`,
	`sum(rate(native[5m]))`,
	`histogram_quantile(0.9, sum by (le) (rate(req_bucket[5m])))`,
	`histogram_quantile(0.9, rate(req_bucket[5m]))`,
	`csv_succeeded`,
	`sum by (name) (csv_succeeded) / scalar(count(cluster_version))`,
	`absent(nonexistent)`,
	`count(fleet_rule)`,
	`sum by (name) (csv_succeeded offset 5m)`,
	`avg by (name) (csv_succeeded)`,
	`count(csv_succeeded * on (_id) group_left (version) cluster_version)`,
	`count(csv_succeeded * on (name) group_left () count by (name) (cluster_version))`,
	`count by (_id) (label_join(csv_succeeded, "_id", "-", "_id", "version"))`,
	`max(max_over_time(csv_succeeded[10m:1m]))`,
	// Ties (every cluster at 0 at 0m) are broken by input order: the
	// merged fleet's, label order.
	`topk(2, sum by (_id) (req_bucket))`,
	`bottomk(2, sum by (_id) (req_bucket))`,
}

const minute = int64(time.Minute / time.Millisecond)

// fleet is three shards of nine clusters (cluster c on shard c mod 3), and
// their merge.
type fleet struct {
	shards []*teststorage.TestStorage
}

func newFleet(t *testing.T) *fleet {
	f := &fleet{}
	for range 3 {
		f.shards = append(f.shards, teststorage.New(t))
	}
	for c := range 9 {
		f.write(t, c%3, c, 0, 60)
	}
	// A series without _id, on one shard only (a rule's result).
	app := f.shards[0].Appender(context.Background())
	for m := int64(0); m <= 60; m++ {
		_, err := app.Append(0, labels.FromStrings("__name__", "fleet_rule", "name", "a"), m*minute, 1)
		require.NoError(t, err)
	}
	require.NoError(t, app.Commit())
	return f
}

// write appends cluster c's series from minute `from` to `to` into shard s,
// every 30 s; cluster 4's csv_succeeded has a 20-minute gap (longer than
// the lookback) and csv_abnormal comes and goes.
func (f *fleet) write(t *testing.T, s, c int, from, to int64) {
	app := f.shards[s].Appender(context.Background())
	id := fmt.Sprintf("cluster-%d", c)
	for ts := from * minute; ts <= to*minute; ts += minute / 2 {
		i := ts / (minute / 2)
		add := func(v float64, kv ...string) {
			_, err := app.Append(0, labels.FromStrings(append([]string{"_id", id}, kv...)...), ts, v)
			require.NoError(t, err)
		}
		if c != 4 || ts < 20*minute || ts > 40*minute {
			add(float64((int64(c)+i)%2), "__name__", "csv_succeeded", "name", fmt.Sprintf("op%d", c%2), "version", fmt.Sprintf("v%d", c%3))
		}
		if (int64(c)+i/10)%3 == 0 {
			add(1, "__name__", "csv_abnormal", "name", "op1", "version", "v1", "phase", "Failed", "reason", fmt.Sprintf("r%d", c%2))
		}
		add(1, "__name__", "cluster_version", "version", fmt.Sprintf("4.%d", c%4))
		for j, le := range []string{"0.1", "1", "+Inf"} {
			add(float64(i*int64(j+1)*int64(c+1)), "__name__", "req_bucket", "le", le)
		}
		_, err := app.AppendHistogram(0, labels.FromStrings("__name__", "native", "_id", id), ts, tsdbutil.GenerateTestHistogram(i*int64(c+1)), nil)
		require.NoError(t, err)
	}
	require.NoError(t, app.Commit())
}

// queryable is the merge of the shards, skipping those in skip.
func (f *fleet) queryable(skip ...int) promstorage.Queryable {
	return promstorage.QueryableFunc(func(mint, maxt int64) (promstorage.Querier, error) {
		var qs []promstorage.Querier
		for i, s := range f.shards {
			if !contains(skip, i) {
				q, err := s.Querier(mint, maxt)
				if err != nil {
					return nil, err
				}
				qs = append(qs, q)
			}
		}
		return promstorage.NewMergeQuerier(qs, nil, promstorage.ChainedSeriesMerge), nil
	})
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func newEngine() *promql.Engine {
	return promql.NewEngine(promql.EngineOpts{
		Logger: slog.New(slog.DiscardHandler), MaxSamples: 1e7, Timeout: time.Minute,
		LookbackDelta: 5 * time.Minute, EnableAtModifier: true, EnableNegativeOffset: true,
		EnableDelayedNameRemoval: true,
	})
}

// inProcess is a shard evaluated in this process.
type inProcess struct {
	name string
	eng  promql.QueryEngine
	q    promstorage.Queryable
	err  error
}

func (s inProcess) Name() string { return s.name }

func (s inProcess) Eval(ctx context.Context, req Request) (*Result, error) {
	if s.err != nil {
		return nil, s.err
	}
	return Evaluate(ctx, s.eng, s.q, "_id", req)
}

// overHTTP is a shard behind NewHandler, through the wire format.
type overHTTP struct{ url string }

func (overHTTP) Name() string { return "http" }

func (s overHTTP) Eval(ctx context.Context, req Request) (*Result, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+Path, strings.NewReader(EncodeRequest(req).Encode()))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	return ReadResult(resp)
}

// pushdownEngine pushes down to shard 0 (local), 1 (in process) and 2
// (over HTTP), with peers overriding the last two.
func (f *fleet) pushdownEngine(t *testing.T, reg prometheus.Registerer, peers ...Shard) *Engine {
	eng := newEngine()
	if peers == nil {
		srv := httptest.NewServer(NewHandler(slog.New(slog.DiscardHandler), eng, f.shards[2], "_id", nil))
		t.Cleanup(srv.Close)
		peers = []Shard{inProcess{name: "one", eng: eng, q: f.shards[1]}, overHTTP{url: srv.URL}}
	}
	return New(slog.New(slog.DiscardHandler), reg, eng, Options{
		ClusterLabel: "_id", Local: f.shards[0], Peers: func() []Shard { return peers },
	})
}

type evaluation struct {
	name       string
	start, end int64 // minutes
	step       time.Duration
}

var evaluations = []evaluation{
	{"instant at 30m (in cluster-4's gap)", 30, 30, 0},
	{"instant at 60m", 60, 60, 0},
	{"range 10m-60m step 1m", 10, 60, time.Minute},
	{"range 0m-60m step 7m (longer than the lookback)", 0, 60, 7 * time.Minute},
}

func run(t *testing.T, eng promql.QueryEngine, q promstorage.Queryable, qs string, ev evaluation) *promql.Result {
	t.Helper()
	ctx := context.Background()
	var (
		qry promql.Query
		err error
	)
	if ev.step == 0 {
		qry, err = eng.NewInstantQuery(ctx, q, nil, qs, time.UnixMilli(ev.start*minute))
	} else {
		qry, err = eng.NewRangeQuery(ctx, q, nil, qs, time.UnixMilli(ev.start*minute), time.UnixMilli(ev.end*minute), ev.step)
	}
	require.NoError(t, err)
	t.Cleanup(qry.Close)
	return qry.Exec(ctx)
}

// points is a result as label set -> timestamp -> value (histograms as
// their string form), for comparison regardless of series order.
func points(t *testing.T, res *promql.Result) map[string]map[int64]string {
	t.Helper()
	require.NoError(t, res.Err)
	out := map[string]map[int64]string{}
	add := func(ls labels.Labels, ts int64, v string) {
		k := ls.String()
		if out[k] == nil {
			out[k] = map[int64]string{}
		}
		out[k][ts] = v
	}
	// Sums over shards add in another order: equal to 12 digits.
	f := func(v float64) string { return fmt.Sprintf("%.12g", v) }
	fh := func(h *histogram.FloatHistogram) string {
		h = h.Copy()
		h.Sum, _ = strconv.ParseFloat(f(h.Sum), 64)
		return h.String()
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		for _, s := range v {
			if s.H != nil {
				add(s.Metric, s.T, fh(s.H))
			} else {
				add(s.Metric, s.T, f(s.F))
			}
		}
	case promql.Matrix:
		for _, s := range v {
			for _, p := range s.Floats {
				add(s.Metric, p.T, f(p.F))
			}
			for _, p := range s.Histograms {
				add(s.Metric, p.T, fh(p.H))
			}
		}
	case promql.Scalar:
		add(labels.EmptyLabels(), v.T, f(v.V))
	default:
		t.Fatalf("unexpected result %T", v)
	}
	return out
}

func TestPushdownAnswersAsTheMergedFleet(t *testing.T) {
	f := newFleet(t)
	reg := prometheus.NewRegistry()
	pd := f.pushdownEngine(t, reg)
	ref := newEngine()
	for _, qs := range queries {
		for _, ev := range evaluations {
			t.Run(qs+"/"+ev.name, func(t *testing.T) {
				want := run(t, ref, f.queryable(), qs, ev)
				got := run(t, pd, f.queryable(), qs, ev)
				require.Equal(t, points(t, want), points(t, got))
				require.Empty(t, got.Warnings)
			})
		}
	}
	require.Positive(t, testutil.ToFloat64(pd.parts.WithLabelValues("pushed")))
	require.Zero(t, testutil.ToFloat64(pd.parts.WithLabelValues("overlap")))
	require.Zero(t, testutil.ToFloat64(pd.parts.WithLabelValues("error")))
}

// vectorLabels is an instant query's answer's label sets, in its order.
func vectorLabels(t *testing.T, res *promql.Result) []string {
	t.Helper()
	require.NoError(t, res.Err)
	var out []string
	for _, s := range res.Value.(promql.Vector) {
		out = append(out, s.Metric.String())
	}
	return out
}

// TestPushdownKeepsAbsentLabelsAndSortOrder: absent takes its answer's
// labels from its argument's matchers, and sort's answer is an order; both
// answer as over the merged fleet (points() ignores both).
func TestPushdownKeepsAbsentLabelsAndSortOrder(t *testing.T) {
	f := newFleet(t)
	pd := f.pushdownEngine(t, nil)
	ref := newEngine()
	at60 := evaluation{"instant at 60m", 60, 60, 0}
	for _, qs := range []string{
		`absent(csv_succeeded{name="nope", version="v9"})`,
		`absent_over_time(csv_succeeded{name="nope"}[10m])`,
		`sort_desc(sum by (_id) (req_bucket))`,
		`sort(sum by (_id) (req_bucket))`,
	} {
		want := vectorLabels(t, run(t, ref, f.queryable(), qs, at60))
		require.NotEmpty(t, want, qs)
		require.Equal(t, want, vectorLabels(t, run(t, pd, f.queryable(), qs, at60)), qs)
	}
}

// hangingShard answers only when its context ends, with an error that is
// not ErrUnavailable (so the part falls back to the merged evaluation).
type hangingShard struct{}

func (hangingShard) Name() string { return "peer hanging" }

func (hangingShard) Eval(ctx context.Context, _ Request) (*Result, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestPushdownTimeoutBoundsTheWholeQuery: the parts on every shard, the
// merged fallback and the outer query share one timeout; a query with a
// hanging peer times out once, as the inner engine reports a timeout.
func TestPushdownTimeoutBoundsTheWholeQuery(t *testing.T) {
	f := newFleet(t)
	pd := New(slog.New(slog.DiscardHandler), nil, newEngine(), Options{
		ClusterLabel: "_id", Local: f.shards[0], Peers: func() []Shard { return []Shard{hangingShard{}} },
		Timeout: 300 * time.Millisecond,
	})
	start := time.Now()
	res := run(t, pd, f.queryable(), `count by (name) (csv_succeeded)`, evaluation{"instant at 60m", 60, 60, 0})
	var timeout promql.ErrQueryTimeout
	require.ErrorAs(t, res.Err, &timeout)
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestPushdownMovedClusterIsEvaluatedMerged(t *testing.T) {
	f := newFleet(t)
	f.write(t, 1, 9, 0, 29) // cluster-9 moves from shard 1 to shard 2 at 30m
	f.write(t, 2, 9, 30, 60)
	pd := f.pushdownEngine(t, nil)
	ref := newEngine()
	for _, qs := range []string{`count by (name, version) (csv_succeeded)`, `count by (_id) ({_id!=""})`, `sum(rate(native[5m]))`} {
		for _, ev := range evaluations {
			want := run(t, ref, f.queryable(), qs, ev)
			got := run(t, pd, f.queryable(), qs, ev)
			require.Equal(t, points(t, want), points(t, got), "%s, %s", qs, ev.name)
		}
	}
	require.Positive(t, testutil.ToFloat64(pd.parts.WithLabelValues("overlap")), "the move is seen")
	// After the move and its lookback, cluster-9 is on one shard again.
	before := testutil.ToFloat64(pd.parts.WithLabelValues("pushed"))
	run(t, pd, f.queryable(), `count(csv_succeeded)`, evaluation{start: 60, end: 60})
	require.Equal(t, before+1, testutil.ToFloat64(pd.parts.WithLabelValues("pushed")))
}

func TestPushdownPeerDownIsAWarning(t *testing.T) {
	f := newFleet(t)
	eng := newEngine()
	pd := f.pushdownEngine(t, nil,
		inProcess{name: "peer one", err: fmt.Errorf("%w: connection refused", ErrUnavailable)},
		inProcess{name: "two", eng: eng, q: f.shards[2]})
	qs := `count by (name, version) (csv_succeeded)`
	for _, ev := range evaluations {
		want := run(t, eng, f.queryable(1), qs, ev)
		got := run(t, pd, f.queryable(), qs, ev)
		require.Equal(t, points(t, want), points(t, got))
		ws, _ := got.Warnings.AsStrings(qs, 0, 0)
		require.Len(t, ws, 1)
		require.Contains(t, ws[0], "peer one unavailable, its data is missing")
	}
}

func TestPushdownOtherPeerErrorsEvaluateMerged(t *testing.T) {
	f := newFleet(t)
	reg := prometheus.NewRegistry()
	pd := f.pushdownEngine(t, reg, inProcess{name: "old", err: fmt.Errorf("404 Not Found")}, inProcess{name: "two", eng: newEngine(), q: f.shards[2]})
	ev := evaluations[2]
	want := run(t, newEngine(), f.queryable(), `count(csv_succeeded)`, ev)
	got := run(t, pd, f.queryable(), `count(csv_succeeded)`, ev)
	require.Equal(t, points(t, want), points(t, got))
	require.Equal(t, 1.0, testutil.ToFloat64(pd.parts.WithLabelValues("error")))
}

func TestPushdownSkippedWhenTheRangeReachesTheBucket(t *testing.T) {
	f := newFleet(t)
	eng := newEngine()
	var asked [2]int64
	pd := New(slog.New(slog.DiscardHandler), nil, eng, Options{
		ClusterLabel: "_id", Local: f.shards[0],
		Peers: func() []Shard { return []Shard{inProcess{name: "x", err: fmt.Errorf("must not be asked")}} },
		InBucket: func(_ context.Context, mint, maxt int64) bool {
			asked = [2]int64{mint, maxt}
			return true
		},
	})
	got := run(t, pd, f.queryable(), `count(max_over_time(csv_succeeded[15m]))`, evaluations[2])
	want := run(t, eng, f.queryable(), `count(max_over_time(csv_succeeded[15m]))`, evaluations[2])
	require.Equal(t, points(t, want), points(t, got))
	require.Equal(t, [2]int64{(10-15)*minute + 1, 60 * minute}, asked, "the data range: start minus the range (left-open), to end")
	require.Equal(t, 1.0, testutil.ToFloat64(pd.queries.WithLabelValues("bucket")))
}

func TestPlan(t *testing.T) {
	for _, tc := range []struct{ in, outer string }{
		{`count by (name) (x)`, `sum by (name) (__pushdown_0__)`},
		{`sum without (_id) (rate(x[5m]))`, `sum without (_id, __pushdown_shard__) (__pushdown_0__)`},
		{`sum without (v) (rate(x[5m]))`, `__pushdown_0__`},
		{`max by (_id, v) (x)`, `__pushdown_0__`},
		{`quantile(0.5, count by (_id) (x))`, `quantile(0.5, __pushdown_0__)`},
		{`avg(x)`, `avg(__pushdown_0__)`},
		{`sum(x) / scalar(count(y))`, `sum(__pushdown_0__) / scalar(sum(__pushdown_1__))`},
		{`count(x * on (name) y)`, `count(__pushdown_0__ * on (name) __pushdown_1__)`},
		{`count(x * on (_id, name) y)`, `sum(__pushdown_0__)`},
		{`sum(label_replace(x, "_id", "a", "", ""))`, `sum(label_replace(__pushdown_0__, "_id", "a", "", ""))`},
		{`max_over_time(count(x)[10m:1m])`, `max_over_time(count(x)[10m:1m])`},
		{`absent(x{name="a"})`, `absent(x{name="a"})`},
		{`absent_over_time(x{name="a"}[5m])`, `absent_over_time(x{name="a"}[5m])`},
		{`sort_desc(sum by (_id) (x))`, `sort_desc(__pushdown_0__)`},
		{`sort(rate(x[5m]))`, `sort(__pushdown_0__)`},
		{`count(x > scalar(y))`, `count(__pushdown_0__ > scalar(__pushdown_1__))`},
		{`time()`, `time()`},
		{`count(hour())`, `count(hour())`},
	} {
		expr, err := parser.NewParser(parser.Options{}).ParseExpr(tc.in)
		require.NoError(t, err)
		outer, _ := plan(expr, "_id")
		require.Equal(t, tc.outer, outer.String(), tc.in)
	}
}

func TestPushdownKeepsTheQueryLookback(t *testing.T) {
	f := newFleet(t)
	pd := f.pushdownEngine(t, nil)
	ref := newEngine()
	at := time.UnixMilli(30*minute + 20_000) // 20s after a sample, 10s before the next
	for _, lookback := range []time.Duration{10 * time.Second, 30 * time.Second} {
		opts := promql.NewPrometheusQueryOpts(false, lookback, nil)
		results := map[string]*promql.Result{}
		for name, eng := range map[string]promql.QueryEngine{"ref": ref, "pushdown": pd} {
			qry, err := eng.NewInstantQuery(context.Background(), f.queryable(), opts, `count(csv_succeeded)`, at)
			require.NoError(t, err)
			t.Cleanup(qry.Close)
			results[name] = qry.Exec(context.Background())
		}
		require.Equal(t, points(t, results["ref"]), points(t, results["pushdown"]), lookback)
		require.Equal(t, lookback == 10*time.Second, len(points(t, results["ref"])) == 0, "10s sees no sample")
	}
}
