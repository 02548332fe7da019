package peers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/query"
)

// barrier holds every request until n have arrived, then lets them all
// through and starts over: peers asked one after another never overlap, so
// each request gives up after wait (a 503, a warning of the merge) and the
// test fails instead of hanging. A request that gives up leaves its round,
// so that the next round still needs n requests of its own.
type barrier struct {
	n    int
	wait time.Duration

	mu      sync.Mutex
	arrived int
	all     chan struct{}
}

// barrierWait is how long a request waits for the others: far beyond a
// loaded -race CI's scheduling delays, and the peer timeout of the tests
// that use it is longer (so that the 503 is what they see).
const barrierWait = 30 * time.Second

func newBarrier(n int) *barrier {
	return &barrier{n: n, wait: barrierWait, all: make(chan struct{})}
}

func (b *barrier) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body first: the server notices a client that went away
		// (r.Context) only once it has.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		b.mu.Lock()
		all := b.all
		if b.arrived++; b.arrived == b.n {
			close(all)
			b.arrived, b.all = 0, make(chan struct{})
		}
		b.mu.Unlock()
		t := time.NewTimer(b.wait)
		defer t.Stop()
		select {
		case <-all:
			h.ServeHTTP(w, r)
			return
		case <-t.C:
			http.Error(w, "peers asked one after another", http.StatusServiceUnavailable)
		case <-r.Context().Done():
		}
		b.mu.Lock()
		if b.all == all { // its round is still waiting: leave it
			b.arrived--
		}
		b.mu.Unlock()
	})
}

// patience is how long a test waits for what must happen: minutes, as a
// loaded -race CI may need, yet short of the test binary's deadline, so
// that a hang fails with the test's message rather than a panic.
func patience(t *testing.T) time.Duration {
	if d, ok := t.Deadline(); ok {
		return time.Until(d) / 2
	}
	return 5 * time.Minute
}

// hangingPeer is a peer that takes every request and answers none until
// the request's context ends (the caller cancels, or the peer timeout);
// arrived receives each request.
func hangingPeer(t *testing.T) (addr string, arrived <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that the server notices the client going away
		ch <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return host(srv), ch
}

// seriesOf lists the series of a series-only Select of q (as the series
// API does), their warnings and its error.
func seriesOf(q promstorage.Querier, mint, maxt int64, limit int, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	ss := q.Select(context.Background(), true, &promstorage.SelectHints{Start: mint, End: maxt, Func: "series", Limit: limit}, ms...)
	var out []string
	for ss.Next() {
		out = append(out, ss.At().Labels().String())
	}
	return out, ss.Warnings(), ss.Err()
}

func TestPeersAreAskedInParallel(t *testing.T) {
	const n = 3
	f := newFixture(t)
	b := newBarrier(n)
	var addrs []string
	for i := range n {
		s := f.set(t, nil, f.config())
		h, _ := replicaHandler(s, tenantDBs{"acme": openSeries(t, csv(fmt.Sprintf("p%d-op", i), "c"+fmt.Sprint(i)))}, nil)
		mux := http.NewServeMux()
		mux.Handle("/", b.wrap(h))
		mux.Handle("GET "+MetadataPath, b.wrap(metadataHandler(s, metadataIndex{"acme": {fmt.Sprintf("m%d", i): {mdGauge}}})))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		addrs = append(addrs, host(srv))
	}
	cfg := f.config(addrs...)
	cfg.Timeout = model.Duration(2 * barrierWait)
	a := f.set(t, nil, cfg)
	q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("own-op", "c9"))}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer q.Close()
	ctx := context.Background()

	vals, ws, err := q.LabelValues(ctx, "name", nil)
	require.NoError(t, err)
	require.Empty(t, ws, "every peer reached while the others waited")
	require.Equal(t, []string{"own-op", "p0-op", "p1-op", "p2-op"}, vals)

	names, ws, err := q.LabelNames(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, ws)
	require.Equal(t, []string{"__name__", "_id", "name"}, names)

	series, ws, err := seriesOf(q, 0, 10_000, 0, labels.MustNewMatcher(labels.MatchEqual, "__name__", "csv_succeeded"))
	require.NoError(t, err)
	require.Empty(t, ws)
	require.Len(t, series, n+1)

	md, ws, err := a.Metadata(query.LocalMetadata(metadataIndex{})).Metadata(ctx, "acme", query.MetadataQuery{Limit: -1})
	require.NoError(t, err)
	require.Empty(t, ws)
	require.Equal(t, map[string][]metadata.Metadata{"m0": {mdGauge}, "m1": {mdGauge}, "m2": {mdGauge}}, md)
}

// A peer that answers late (after the others, with an error) or not at
// all is a warning; the others' answer is the same as without it.
func TestSlowOrDeadPeerLeavesTheOthersAnswer(t *testing.T) {
	f := newFixture(t)
	local := tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}
	peerData := tenantDBs{"acme": openSeries(t, csv("b-op", "c2"), csv("z-op", "c2"))}
	// The live peer, twice: asked alone, and with the others, where each
	// answer it sends lets the slow peer answer the same call.
	served := make(chan struct{}, 16)
	liveAlone := serve(t, f.set(t, nil, f.config()), peerData, nil)
	h, _ := replicaHandler(f.set(t, nil, f.config()), peerData, nil)
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		served <- struct{}{}
	}))
	t.Cleanup(live.Close)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that the server notices the client going away
		select {
		case <-served:
			http.Error(w, "too late", http.StatusServiceUnavailable)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)

	// The default peer timeout (30s) bounds no call here: the slow peer
	// answers as soon as the live one has.
	all := f.set(t, nil, f.config(host(live), host(slow), deadPeer)).NewReader(local)
	alone := f.set(t, nil, f.config(host(liveAlone))).NewReader(local)
	csvOnly := labels.MustNewMatcher(labels.MatchEqual, "__name__", "csv_succeeded")

	type answer struct{ values, names, series []string }
	ask := func(r *Reader, limit int) (answer, []string) {
		t.Helper()
		q, err := r.Querier("acme", 0, 10_000)
		require.NoError(t, err)
		defer q.Close()
		var (
			got answer
			ws  annotations.Annotations
		)
		hints := &promstorage.LabelHints{Limit: limit}
		var w []string
		warned := func() {
			for _, err := range ws.AsErrors() {
				w = append(w, err.Error())
			}
		}
		got.values, ws, err = q.LabelValues(context.Background(), "name", hints, csvOnly)
		require.NoError(t, err)
		warned()
		got.names, ws, err = q.LabelNames(context.Background(), hints)
		require.NoError(t, err)
		warned()
		got.series, ws, err = seriesOf(q, 0, 10_000, limit, csvOnly)
		require.NoError(t, err)
		warned()
		return got, w
	}
	for _, limit := range []int{0, 2} {
		want, ws := ask(alone, limit)
		require.Empty(t, ws)
		got, ws := ask(all, limit)
		require.Equal(t, want, got, "limit %d", limit)
		require.Len(t, ws, 6, "the slow and the dead peer, three calls: %v", ws)
		for _, w := range ws {
			require.Regexp(t, "peer ("+host(slow)+"|"+deadPeer+") unavailable, its data is missing", w)
		}
	}
}

// A peer that does not answer within the peer timeout is a warning, and a
// failed read.
func TestPeerTimeoutIsAWarning(t *testing.T) {
	f := newFixture(t)
	addr, _ := hangingPeer(t)
	cfg := f.config(addr)
	cfg.Timeout = model.Duration(time.Second) // the shortest Validate allows
	a := f.set(t, prometheus.NewRegistry(), cfg)
	q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer q.Close()
	timedOut := func(ws annotations.Annotations) {
		t.Helper()
		require.Len(t, ws, 1)
		require.ErrorContains(t, ws.AsErrors()[0], "peer "+addr+" unavailable, its data is missing")
		require.ErrorIs(t, ws.AsErrors()[0], context.DeadlineExceeded)
	}

	vals, ws, err := q.LabelValues(context.Background(), "name", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"a-op"}, vals, "this replica's")
	timedOut(ws)
	series, ws, err := seriesOf(q, 0, 10_000, 0, labels.MustNewMatcher(labels.MatchEqual, "__name__", "csv_succeeded"))
	require.NoError(t, err)
	require.Equal(t, []string{`{__name__="csv_succeeded", _id="c1", name="a-op"}`}, series)
	timedOut(ws)
	require.Equal(t, 2.0, testutil.ToFloat64(a.m.reads.WithLabelValues("error")))
}

func TestCancellingALabelCallEndsItsPeerCalls(t *testing.T) {
	f := newFixture(t)
	addr1, arrived1 := hangingPeer(t)
	addr2, arrived2 := hangingPeer(t)
	cfg := f.config(addr1, addr2)
	cfg.Timeout = model.Duration(2 * patience(t)) // not what ends them
	a := f.set(t, nil, cfg)
	q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer q.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _ = q.LabelValues(ctx, "name", nil) // whichever error: that it returns is the point
	}()
	<-arrived1
	<-arrived2
	cancel()
	select {
	case <-done: // its peer calls ended: goleak would see them otherwise
	case <-time.After(patience(t)):
		t.Fatal("the label call outlived its context")
	}
}

// failingLabels is a local reader whose label values call fails, once
// release is closed.
type failingLabels struct{ release <-chan struct{} }

func (l failingLabels) Querier(string, int64, int64) (promstorage.Querier, error) {
	return failingLabelsQuerier{Querier: promstorage.NoopQuerier(), release: l.release}, nil
}

type failingLabelsQuerier struct {
	promstorage.Querier
	release <-chan struct{}
}

func (q failingLabelsQuerier) LabelValues(context.Context, string, *promstorage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	<-q.release
	return nil, nil, errors.New("bucket down")
}

// A peer call that ends because its caller's context did is not the
// peer's failure: not counted as a failed read (nor logged).
func TestCancelledPeerCallsAreNotFailedReads(t *testing.T) {
	f := newFixture(t)
	csvOnly := labels.MustNewMatcher(labels.MatchEqual, "__name__", "csv_succeeded")

	t.Run("the caller goes away", func(t *testing.T) {
		addr, arrived := hangingPeer(t)
		a := f.set(t, prometheus.NewRegistry(), f.config(addr))
		q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}).Querier("acme", 0, 10_000)
		require.NoError(t, err)
		defer q.Close()
		for _, tc := range []struct {
			name string
			call func(context.Context)
		}{
			{"label values", func(ctx context.Context) { _, _, _ = q.LabelValues(ctx, "name", nil) }},
			{"label names", func(ctx context.Context) { _, _, _ = q.LabelNames(ctx, nil) }},
			{"metadata", func(ctx context.Context) {
				_, _, _ = a.Metadata(query.LocalMetadata(metadataIndex{})).Metadata(ctx, "acme", query.MetadataQuery{Limit: -1})
			}},
			{"series", func(ctx context.Context) {
				ss := q.Select(ctx, true, &promstorage.SelectHints{Start: 0, End: 10_000, Func: "series"}, csvOnly)
				for ss.Next() {
				}
			}},
		} {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				tc.call(ctx)
			}()
			<-arrived
			cancel()
			<-done
			require.Zero(t, testutil.ToFloat64(a.m.reads.WithLabelValues("error")), tc.name)
		}
	})

	t.Run("this replica's own call fails", func(t *testing.T) {
		addr, arrived := hangingPeer(t)
		a := f.set(t, prometheus.NewRegistry(), f.config(addr))
		release := make(chan struct{})
		q, err := a.NewReader(failingLabels{release: release}).Querier("acme", 0, 10_000)
		require.NoError(t, err)
		defer q.Close()
		go func() {
			<-arrived // the peer's call is under way
			close(release)
		}()
		_, _, err = q.LabelValues(context.Background(), "name", nil)
		require.ErrorContains(t, err, "bucket down")
		require.Zero(t, testutil.ToFloat64(a.m.reads.WithLabelValues("error")), "fanOut cancelled the peer's call")
	})
}

// warnedLabels is a local reader whose label values call answers vals
// with ws, the same map every time.
type warnedLabels struct {
	vals []string
	ws   annotations.Annotations
}

func (l warnedLabels) Querier(string, int64, int64) (promstorage.Querier, error) {
	return warnedLabelsQuerier{Querier: promstorage.NoopQuerier(), l: l}, nil
}

type warnedLabelsQuerier struct {
	promstorage.Querier
	l warnedLabels
}

func (q warnedLabelsQuerier) LabelValues(context.Context, string, *promstorage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return q.l.vals, q.l.ws, nil
}

// The merge adds the peers' values and warnings to its own copy, never to
// this replica's answer (which its querier may keep or share).
func TestFanOutLeavesItsOwnAnswerAsItIs(t *testing.T) {
	f := newFixture(t)
	b := serve(t, f.set(t, nil, f.config()), tenantDBs{"acme": openSeries(t, csv("b-op", "c2"))}, nil)
	own := warnedLabels{vals: make([]string, 1, 8), ws: annotations.New().Add(errors.New("own warning"))}
	own.vals[0] = "a-op"
	q, err := f.set(t, nil, f.config(host(b), deadPeer)).NewReader(own).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer q.Close()
	vals, ws, err := q.LabelValues(context.Background(), "name", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"a-op", "b-op"}, vals)
	require.Len(t, ws, 2, "its own and the peer that is down")
	require.Len(t, own.ws, 1, "this replica's warnings as they were")
	require.Empty(t, own.vals[:2][1], "nothing appended in place of its values")
}

// deadPeer refuses connections for good: port 1 on loopback has no server
// (a closed test server's port could be taken again meanwhile).
const deadPeer = "127.0.0.1:1"

// pairedPeer serves h once two requests are in flight together; a request
// alone gives up waiting after 10s. most is the most requests it saw in
// flight at once.
func pairedPeer(t *testing.T, h http.Handler) (addr string, most *atomic.Int64) {
	t.Helper()
	var inFlight atomic.Int64
	most = new(atomic.Int64)
	arrived := make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n == 2 {
			once.Do(func() { close(arrived) })
		}
		select { // both requests, or give up
		case <-arrived:
		case <-time.After(10 * time.Second):
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return host(srv), most
}

// Selects of one query (PromQL's selectors, the series API's match[] sets)
// ask the peer together: the peer sees both reads in flight at once, where
// asked one after another each would wait for the other until the barrier
// gives up.
func TestSelectsAskThePeerTogether(t *testing.T) {
	f := newFixture(t)
	peerB := f.set(t, nil, f.config())
	h, _ := replicaHandler(peerB, tenantDBs{"acme": openDB(t, map[string][]int64{"x": {1000}, "y": {2000}})}, nil)
	b, most := pairedPeer(t, h)

	a := f.set(t, nil, f.config(b))
	q, err := a.NewReader(tenantDBs{}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	ctx := context.Background()
	sets := []promstorage.SeriesSet{
		q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "x")),
		q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "y")),
	}
	for i, name := range []string{"x", "y"} {
		require.True(t, sets[i].Next(), name)
		require.Equal(t, name, sets[i].At().Labels().Get("__name__"))
		require.False(t, sets[i].Next())
		require.NoError(t, sets[i].Err())
		require.Empty(t, sets[i].Warnings())
	}
	require.Equal(t, int64(2), most.Load(), "the two reads were in flight together")
}

// A label call's match[] sets ask the peer together too (query's
// withMatchSets; Prometheus' handlers ask for one set after another), so
// that a peer that does not answer costs one peer timeout, not one per
// set: the peer sees both calls in flight at once.
func TestLabelCallMatchSetsAskThePeerTogether(t *testing.T) {
	f := newFixture(t)
	peerB := f.set(t, nil, f.config())
	h, reads := replicaHandler(peerB, tenantDBs{"acme": openSeries(t, csv("b-op", "c2"), labels.FromStrings("__name__", "up", "job", "b"))}, nil)
	for _, path := range []string{query.LabelNamesPath, "/api/v1/label/__name__/values"} {
		t.Run(path, func(t *testing.T) {
			b, most := pairedPeer(t, h)
			a := f.set(t, nil, f.config(b))
			api := query.NewHandler(discard, nil, a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}), query.Options{})
			form := url.Values{"match[]": {"csv_succeeded", "up"}}
			r := httptest.NewRequest(http.MethodGet, path+"?"+form.Encode(), nil)
			r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: "acme"}))
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, r)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			var body struct {
				Data     []string
				Warnings []string
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
			want := []string{"__name__", "_id", "job", "name"}
			if path != query.LabelNamesPath {
				want = []string{"csv_succeeded", "up"}
			}
			require.Equal(t, want, body.Data)
			require.Empty(t, body.Warnings)
			require.Equal(t, int64(2), most.Load(), "the two sets' calls were in flight together")
		})
	}
	require.Zero(t, reads.Load(), "asked of the peer's index")
}

// Select's call runs on after it returns: it must not read what the caller
// changes then. PromQL sorts the hints' Grouping after Select (promql's
// evaluator); under -race a shared slice is a data race.
func TestSelectOwnsItsHints(t *testing.T) {
	f := newFixture(t)
	peerB := f.set(t, nil, f.config())
	b := serve(t, peerB, tenantDBs{"acme": openDB(t, map[string][]int64{"x": {1000}})}, nil)
	a := f.set(t, nil, f.config(host(b)))
	q, err := a.NewReader(tenantDBs{}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	hints := &promstorage.SelectHints{Start: 0, End: 10_000, Func: "sum", By: true, Grouping: []string{"zone", "cluster", "b", "a"}}
	ss := q.Select(context.Background(), true, hints, labels.MustNewMatcher(labels.MatchEqual, "__name__", "x"))
	slices.Sort(hints.Grouping)
	hints.Grouping[0] = "changed"
	n := 0
	for ss.Next() {
		n++
	}
	require.NoError(t, ss.Err())
	require.Equal(t, 1, n)
}
