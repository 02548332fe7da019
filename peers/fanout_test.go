package peers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
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

	"github.com/phonehome/phonehome/query"
)

// barrier holds every request until n have arrived, then lets them all
// through and starts over: peers asked one after another never overlap, so
// each request gives up after wait (a 503, a warning of the merge) and the
// test fails instead of hanging.
type barrier struct {
	n    int
	wait time.Duration

	mu      sync.Mutex
	arrived int
	all     chan struct{}
}

func newBarrier(n int) *barrier {
	return &barrier{n: n, wait: 3 * time.Second, all: make(chan struct{})}
}

func (b *barrier) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
		case <-t.C:
			http.Error(w, "peers asked one after another", http.StatusServiceUnavailable)
		case <-r.Context().Done():
		}
	})
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
	a := f.set(t, nil, f.config(addrs...))
	q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("own-op", "c9"))}, nil).Querier("acme", 0, 10_000)
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

// A peer that answers late (after the peer timeout) or not at all is a
// warning; the others' answer is the same as without it.
func TestSlowOrDeadPeerLeavesTheOthersAnswer(t *testing.T) {
	f := newFixture(t)
	live := serve(t, f.set(t, nil, f.config()), tenantDBs{"acme": openSeries(t, csv("b-op", "c2"), csv("z-op", "c2"))}, nil)
	slow := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // until the peer timeout
	}))
	t.Cleanup(slow.Close)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // connection refused

	cfg := f.config(host(live), host(slow), host(dead))
	const timeout = time.Second // the shortest Validate allows
	cfg.Timeout = model.Duration(timeout)
	local := tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}
	all := f.set(t, nil, cfg).NewReader(local, nil)
	alone := f.set(t, nil, f.config(host(live))).NewReader(local, nil)
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
			require.Regexp(t, "peer ("+host(slow)+"|"+host(dead)+") unavailable, its data is missing", w)
		}
	}
}

func TestCancellingALabelCallEndsItsPeerCalls(t *testing.T) {
	f := newFixture(t)
	arrived := make(chan struct{}, 2)
	block := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done()
	})
	var addrs []string
	for range 2 {
		srv := httptest.NewServer(block)
		t.Cleanup(srv.Close)
		addrs = append(addrs, host(srv))
	}
	a := f.set(t, nil, f.config(addrs...)) // the peer timeout: 30s
	q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}, nil).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer q.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _ = q.LabelValues(ctx, "name", nil) // whichever error: that it returns is the point
	}()
	<-arrived
	<-arrived
	cancel()
	select {
	case <-done: // its peer calls ended: goleak would see them otherwise
	case <-time.After(5 * time.Second):
		t.Fatal("the label call outlived its context")
	}
}

// hangingPeer is a peer that takes every request and answers none until
// the request's context ends; arrived receives each request.
func hangingPeer(t *testing.T) (addr string, arrived <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		ch <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return host(srv), ch
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
		q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}, nil).Querier("acme", 0, 10_000)
		require.NoError(t, err)
		defer q.Close()
		for _, tc := range []struct {
			name string
			call func(context.Context)
		}{
			{"label values", func(ctx context.Context) { _, _, _ = q.LabelValues(ctx, "name", nil) }},
			{"label names", func(ctx context.Context) { _, _, _ = q.LabelNames(ctx, nil) }},
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
		q, err := a.NewReader(failingLabels{release: release}, nil).Querier("acme", 0, 10_000)
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
