package peers

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// TestBroadcastRepeatsAnAdminCallOnEveryOtherReplica: a peer gets the body,
// the caller's credential and the origin; this receiver itself (listed, as a
// headless Service lists it) answers 204 without acting and is left out; a
// peer that cannot be reached is an answer with its error, not a silence.
func TestBroadcastRepeatsAnAdminCallOnEveryOtherReplica(t *testing.T) {
	f := newFixture(t)
	var (
		self, other http.Handler
		mu          sync.Mutex
		got         []*http.Request
		bodies      []string
	)
	selfSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { self.ServeHTTP(w, r) }))
	t.Cleanup(selfSrv.Close)
	otherSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { other.ServeHTTP(w, r) }))
	t.Cleanup(otherSrv.Close)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String()
	require.NoError(t, l.Close())

	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	a := f.set(t, nil, f.config(addr(selfSrv), addr(otherSrv), dead))
	b := f.set(t, nil, f.config(addr(selfSrv), addr(otherSrv)))
	acting := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		mu.Lock()
		got, bodies = append(got, r), append(bodies, string(body))
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"status":"success"}`))
	}
	self = a.Repeatable(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a repeated call reached its own origin's handler") }))
	other = b.Repeatable(http.HandlerFunc(acting))

	answers := a.Broadcast(context.Background(), "/api/v1/admin/erase", "Bearer adm1n", []byte(`{"cluster_id":"c1"}`))
	require.Len(t, answers, 2, "the other replica and the dead one, not itself: %+v", answers)
	byPeer := map[string]Answer{answers[0].Peer: answers[0], answers[1].Peer: answers[1]}
	require.NoError(t, byPeer[addr(otherSrv)].Err)
	require.Equal(t, http.StatusAccepted, byPeer[addr(otherSrv)].Code)
	require.JSONEq(t, `{"status":"success"}`, string(byPeer[addr(otherSrv)].Body))
	require.Error(t, byPeer[dead].Err)
	require.Len(t, got, 1)
	require.Equal(t, "/api/v1/admin/erase", got[0].URL.Path)
	require.Equal(t, "Bearer adm1n", got[0].Header.Get("Authorization"))
	require.Equal(t, a.Instance(), got[0].Header.Get(OriginHeader))
	require.Equal(t, `{"cluster_id":"c1"}`, bodies[0])

	// Known now to be itself, a is not called again, nor counted as a peer.
	for _, p := range a.snapshot() {
		require.NotEqual(t, addr(selfSrv), p.addr)
	}
	require.Equal(t, 2.0, testutil.ToFloat64(a.m.peers))
}

// TestBroadcastBoundedByPeersTimeout: docs/lifecycle.md calls the peers
// within peers.timeout: a peer that accepts the call and never answers is
// an error once it passes, not a wait for as long as the peer holds on.
func TestBroadcastBoundedByPeersTimeout(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hung.Close()
	defer close(release) // before Close, which waits for the handler
	f := newFixture(t)
	cfg := f.config(strings.TrimPrefix(hung.URL, "http://"))
	cfg.Timeout = model.Duration(time.Second)
	start := time.Now()
	answers := f.set(t, nil, cfg).Broadcast(context.Background(), "/api/v1/admin/erase", "", nil)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Len(t, answers, 1)
	require.ErrorIs(t, answers[0].Err, context.DeadlineExceeded)
}

// TestRepeatCallsOnePeer: Repeat makes a Broadcast's call on one peer only,
// says when the address is no longer a peer, and answers nothing for this
// receiver itself; Peers lists the peers a Broadcast calls.
func TestRepeatCallsOnePeer(t *testing.T) {
	f := newFixture(t)
	var self, other http.Handler
	selfSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { self.ServeHTTP(w, r) }))
	t.Cleanup(selfSrv.Close)
	var (
		mu  sync.Mutex
		got []string
	)
	otherSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { other.ServeHTTP(w, r) }))
	t.Cleanup(otherSrv.Close)
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	a := f.set(t, nil, f.config(addr(selfSrv), addr(otherSrv)))
	b := f.set(t, nil, f.config(addr(otherSrv)))
	self = a.Repeatable(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a repeated call reached its own origin's handler") }))
	other = b.Repeatable(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.Path+" "+r.Header.Get("Authorization")+" "+r.Header.Get(OriginHeader))
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	both := []string{addr(selfSrv), addr(otherSrv)}
	slices.Sort(both)
	require.Equal(t, both, a.Peers(), "itself is not known yet")

	ans := a.Repeat(context.Background(), addr(otherSrv), "/api/v1/admin/readmit", "Bearer adm1n", []byte(`{}`))
	require.NoError(t, ans.Err)
	require.Equal(t, Answer{Peer: addr(otherSrv), Code: http.StatusAccepted, Body: []byte{}}, ans)
	require.Equal(t, []string{"/api/v1/admin/readmit Bearer adm1n " + a.Instance()}, got)

	require.Equal(t, Answer{}, a.Repeat(context.Background(), addr(selfSrv), "/api/v1/admin/readmit", "", nil))
	require.Equal(t, []string{addr(otherSrv)}, a.Peers(), "known now to be itself")
	require.Equal(t, Answer{}, a.Repeat(context.Background(), addr(selfSrv), "/api/v1/admin/readmit", "", nil), "not called again")

	ans = a.Repeat(context.Background(), "127.0.0.1:1", "/api/v1/admin/readmit", "", nil)
	require.ErrorIs(t, ans.Err, errNotPeer)
	require.Equal(t, "127.0.0.1:1", ans.Peer)
	require.Len(t, got, 1)
}
