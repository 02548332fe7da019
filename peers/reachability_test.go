package peers

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// blackhole is a transport to a peer that is gone without a trace: no
// connection is ever made (no GotConn), a call waits for its deadline. Once
// back, it answers /-/ready.
type blackhole struct {
	calls   atomic.Int64 // calls other than probes
	back    atomic.Bool
	waiting chan struct{} // if set, told when a call waits
}

func (b *blackhole) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == "/-/ready" && b.back.Load() {
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: req}, nil
	}
	if req.URL.Path != "/-/ready" {
		b.calls.Add(1)
	}
	if b.waiting != nil {
		b.waiting <- struct{}{}
	}
	<-req.Context().Done()
	return nil, req.Context().Err()
}

func TestUnreachablePeerIsSkippedUntilItAnswers(t *testing.T) {
	f := newFixture(t)
	bh := &blackhole{}
	cfg := f.config("10.0.3.7:9291")
	cfg.Timeout = model.Duration(time.Second)
	require.NoError(t, cfg.Validate())
	reg := prometheus.NewRegistry()
	clock := time.Unix(1_700_000_000, 0)
	s, err := New(discard, reg, cfg, Options{HTTPClient: &http.Client{Transport: bh}, Now: func() time.Time { return clock }})
	require.NoError(t, err)
	read := func() []string {
		q, err := s.NewReader(tenantDBs{}).Querier("acme", 0, 10_000)
		require.NoError(t, err)
		_, ws := readAll(t, q)
		return ws
	}
	unreachable := func() float64 { return testutil.ToFloat64(s.m.reads.WithLabelValues("error")) }
	gauge := func() float64 { return testutil.ToFloat64(s.m.unreachable) }

	// The first read waits for the peer's timeout: a warning, and the peer
	// is marked.
	ws := read()
	require.Len(t, ws, 1)
	require.Contains(t, ws[0], "peer 10.0.3.7:9291 unavailable, its data is missing")
	require.Equal(t, int64(1), bh.calls.Load())
	require.Equal(t, 1.0, gauge())

	// The next reads fail at once, without calling the peer: still a
	// warning, which says why.
	for range 3 {
		ws = read()
		require.Len(t, ws, 1)
		require.Contains(t, ws[0], "unreachable, skipped until it answers again")
	}
	require.Equal(t, int64(1), bh.calls.Load(), "a marked peer is not called")
	require.Equal(t, 4.0, unreachable(), "each skipped read is a failed read")

	// A probe that fails keeps the mark; one that gets an answer clears it.
	p := s.snapshot()[0]
	require.Error(t, s.probe(context.Background(), p))
	require.Equal(t, 1.0, gauge())
	bh.back.Store(true)
	require.NoError(t, s.probe(context.Background(), p))
	require.Equal(t, 0.0, gauge())
	require.NoError(t, p.down.check(clock))

	// Without a probe a mark lapses after probeInterval: a real call tries
	// again.
	s.markUnreachable(p, context.DeadlineExceeded)
	require.Error(t, p.down.check(clock))
	require.NoError(t, p.down.check(clock.Add(probeInterval)))
}

// A call its caller cancelled says nothing about the peer.
func TestCancelledCallDoesNotMarkThePeer(t *testing.T) {
	f := newFixture(t)
	bh := &blackhole{waiting: make(chan struct{}, 1)}
	cfg := f.config("10.0.3.7:9291")
	require.NoError(t, cfg.Validate())
	s, err := New(discard, nil, cfg, Options{HTTPClient: &http.Client{Transport: bh}})
	require.NoError(t, err)
	p := s.snapshot()[0]
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://10.0.3.7:9291/api/v1/read", nil)
	require.NoError(t, err)
	go func() {
		<-bh.waiting
		cancel()
	}()
	_, err = s.roundTrip(p, req)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, p.down.marked())
}

// Run probes the marked peers: one that answers again is read again.
func TestRunProbesUnreachablePeers(t *testing.T) {
	f := newFixture(t)
	bh := &blackhole{}
	cfg := f.config("10.0.3.7:9291")
	require.NoError(t, cfg.Validate())
	s, err := New(discard, nil, cfg, Options{HTTPClient: &http.Client{Transport: bh}})
	require.NoError(t, err)
	s.probeEvery = 10 * time.Millisecond
	p := s.snapshot()[0]
	s.markUnreachable(p, context.DeadlineExceeded)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	bh.back.Store(true)
	require.Eventually(t, func() bool { return !p.down.marked() }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// A peer that connects but answers neither a call nor /-/ready (a hung
// process) is skipped as an unreachable one is; one that answers /-/ready
// is only slow, and is asked again.
func TestHungPeerIsSkippedSlowPeerIsNot(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ready      bool // the peer answers /-/ready
		wantMarked bool
	}{{"hung", false, true}, {"slow", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/-/ready" && tc.ready {
					return
				}
				select {
				case <-r.Context().Done():
				case <-release:
				}
			}))
			defer srv.Close()
			defer close(release) // before Close, which waits for the handlers
			f := newFixture(t)
			cfg := f.config(strings.TrimPrefix(srv.URL, "http://"))
			cfg.Timeout = model.Duration(time.Second)
			s := f.set(t, nil, cfg)
			s.probeEvery = time.Second // the probe's timeout: a slow machine's /-/ready answers within it
			p := s.snapshot()[0]

			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond) // long enough to connect
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v1/read", nil)
			require.NoError(t, err)
			_, err = s.roundTrip(p, req)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.False(t, p.down.marked(), "a call that had a connection does not mark its peer by itself")
			require.Eventually(t, func() bool { return !p.checking.Load() }, 10*time.Second, 5*time.Millisecond, "the hang check ends")
			require.Equal(t, tc.wantMarked, p.down.marked())
			if tc.wantMarked {
				require.ErrorContains(t, p.down.check(time.Now()), "connected, but answered neither a call by its deadline nor /-/ready")
			}
		})
	}
}
