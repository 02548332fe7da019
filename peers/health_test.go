package peers

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// readyPeer answers /-/ready with status (and the given instance id, if
// any) and counts the times it was asked; any other path is 404.
type readyPeer struct {
	status   int
	instance atomic.Pointer[string]
	asked    atomic.Int64
}

func (r *readyPeer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/-/ready" {
		http.NotFound(w, req)
		return
	}
	r.asked.Add(1)
	if id := r.instance.Load(); id != nil {
		w.Header().Set(InstanceHeader, *id)
	}
	w.WriteHeader(r.status)
}

// restartable serves h, and can stop (its address then refuses
// connections) and come back on the same address.
type restartable struct {
	t    *testing.T
	h    http.Handler
	addr string
	srv  *httptest.Server
}

func startRestartable(t *testing.T, h http.Handler) *restartable {
	t.Helper()
	r := &restartable{t: t, h: h, addr: "127.0.0.1:0"}
	r.start()
	t.Cleanup(func() {
		if r.srv != nil {
			r.stop()
		}
	})
	return r
}

func (r *restartable) start() {
	r.t.Helper()
	ln, err := net.Listen("tcp", r.addr)
	require.NoError(r.t, err)
	r.addr = ln.Addr().String()
	r.srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: r.h, ReadHeaderTimeout: 10 * time.Second}}
	r.srv.Start()
}

func (r *restartable) stop() {
	r.srv.CloseClientConnections()
	r.srv.Close()
	r.srv = nil
}

// A replica that makes no call at all (no query, no erasure repeat, no
// push) still notices a peer that stopped, within a few refresh
// intervals, and notices it come back. A peer answering /-/ready 503
// (starting or stopping) answers, so it is reachable, as for the probe.
func TestIdleReplicaNoticesAPeerThatStopped(t *testing.T) {
	f := newFixture(t)
	alive := httptest.NewServer(&readyPeer{status: http.StatusOK})
	t.Cleanup(alive.Close)
	unready := &readyPeer{status: http.StatusServiceUnavailable}
	starting := httptest.NewServer(unready)
	t.Cleanup(starting.Close)
	stopping := startRestartable(t, &readyPeer{status: http.StatusOK})

	reg := prometheus.NewRegistry()
	host := func(u string) string { return strings.TrimPrefix(u, "http://") }
	s := f.set(t, reg, f.config(host(alive.URL), host(starting.URL), stopping.addr))
	s.cfg.RefreshInterval = model.Duration(10 * time.Millisecond) // below Validate's minimum: a test only
	s.probeEvery = time.Second                                    // the probe's timeout: a slow machine's /-/ready answers within it
	gauge := func() float64 { return testutil.ToFloat64(s.m.unreachable) }
	marked := func() []string {
		var out []string
		for _, p := range s.snapshot() {
			if p.down.marked() {
				out = append(out, p.addr)
			}
		}
		return out
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	// A round asks every peer and ends before the next starts: once the
	// unready peer was asked twice, the first round has ended.
	require.Eventually(t, func() bool { return unready.asked.Load() >= 2 }, 10*time.Second, 5*time.Millisecond)
	require.Empty(t, marked(), "peers that answer /-/ready, 503 included, are reachable")

	stopping.stop()
	require.Eventually(t, func() bool { return gauge() == 1 }, 10*time.Second, 5*time.Millisecond,
		"a peer that stopped is marked without any call to it")
	require.Equal(t, []string{stopping.addr}, marked())

	stopping.start()
	require.Eventually(t, func() bool { return gauge() == 0 }, 10*time.Second, 5*time.Millisecond,
		"a peer that came back is reachable again")
}

// A health check round marks the peers that do not answer, with the log
// line of a failed call; it does not ask the peers already marked (the
// probe loop does), nor this receiver, which it recognises by its answer.
func TestHealthCheckRound(t *testing.T) {
	f := newFixture(t)
	self := &readyPeer{status: http.StatusOK}
	selfSrv := httptest.NewServer(self)
	t.Cleanup(selfSrv.Close)
	marked := &readyPeer{status: http.StatusOK}
	markedSrv := httptest.NewServer(marked)
	t.Cleanup(markedSrv.Close)
	gone := startRestartable(t, &readyPeer{status: http.StatusOK})
	gone.stop() // its address refuses connections
	dead := gone.addr

	var logs bytes.Buffer
	cfg := f.config(strings.TrimPrefix(selfSrv.URL, "http://"), strings.TrimPrefix(markedSrv.URL, "http://"), dead)
	require.NoError(t, cfg.Validate())
	s, err := New(slog.New(slog.NewTextHandler(&logs, nil)), nil, cfg, Options{HTTPClient: f.client})
	require.NoError(t, err)
	id := s.Instance()
	self.instance.Store(&id)
	peer := func(addr string) *peer {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.peers[addr]
	}
	s.markUnreachable(peer(strings.TrimPrefix(markedSrv.URL, "http://")), context.DeadlineExceeded)

	s.checkPeers(context.Background())
	require.Equal(t, int64(0), marked.asked.Load(), "a marked peer is the probe loop's")
	require.Equal(t, int64(1), self.asked.Load())
	require.True(t, peer(strings.TrimPrefix(selfSrv.URL, "http://")).self.Load(), "its answer says it is this receiver")
	require.True(t, peer(dead).down.marked())
	require.ErrorContains(t, peer(dead).down.check(time.Now()), "no answer to a health check of /-/ready")
	require.Contains(t, logs.String(), "peer unreachable")
	require.Contains(t, logs.String(), dead)

	s.checkPeers(context.Background())
	require.Equal(t, int64(1), self.asked.Load(), "this receiver is never asked again")
	require.Equal(t, int64(0), marked.asked.Load())
}

// TestHealthCheckBoundsConcurrency: docs/scale-out.md promises at most
// maxConcurrentChecks (8) peers asked at once. Ten peers hold their
// answer until eight are being asked together; then all answer, and no
// more than eight were ever asked at once.
func TestHealthCheckBoundsConcurrency(t *testing.T) {
	f := newFixture(t)
	var inFlight, most atomic.Int64
	release := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		w.WriteHeader(http.StatusOK)
	})
	var addrs []string
	for range 10 {
		srv := httptest.NewServer(slow)
		t.Cleanup(srv.Close)
		addrs = append(addrs, strings.TrimPrefix(srv.URL, "http://"))
	}
	cfg := f.config(addrs...)
	require.NoError(t, cfg.Validate())
	s, err := New(slog.New(slog.DiscardHandler), nil, cfg, Options{HTTPClient: f.client})
	require.NoError(t, err)

	done := make(chan struct{})
	go func() { s.checkPeers(context.Background()); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for inFlight.Load() < maxConcurrentChecks {
		require.True(t, time.Now().Before(deadline), "%d peers asked at once after 10s", inFlight.Load())
		runtime.Gosched()
	}
	close(release)
	<-done
	require.Equal(t, int64(maxConcurrentChecks), most.Load())
	require.Equal(t, 8, maxConcurrentChecks, "the number docs/scale-out.md names")
}
