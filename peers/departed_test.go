package peers

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/pushdown"
)

// srvResolver lists the loopback servers it is given as SRV records.
type srvResolver struct {
	mu      sync.Mutex
	servers []*httptest.Server
}

func (r *srvResolver) set(srvs ...*httptest.Server) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.servers = srvs
}

func (r *srvResolver) LookupIPAddr(context.Context, string) ([]net.IPAddr, error) {
	return []net.IPAddr{{IP: net.IPv4(127, 0, 0, 1)}}, nil
}

func (r *srvResolver) LookupSRV(context.Context, string, string, string) (string, []*net.SRV, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*net.SRV
	for _, s := range r.servers {
		_, port, err := net.SplitHostPort(host(s))
		if err != nil {
			return "", nil, err
		}
		p, _ := strconv.Atoi(port)
		out = append(out, &net.SRV{Target: "r.rcv.svc", Port: uint16(p)})
	}
	return "", out, nil
}

// TestDepartedPeerWarnsUntilTheBucketHasSynced: a replica scaled down
// uploads its head as it stops and leaves DNS. Its data is then in the
// bucket, but not yet in this replica's view of it: until a bucket sync
// that started after the peer left, reads warn that its data is missing
// (before, it was dropped from the peers without a warning, and fleet
// rules recorded the rest of the fleet as the whole).
func TestDepartedPeerWarnsUntilTheBucketHasSynced(t *testing.T) {
	f := newFixture(t)
	stays := serve(t, f.set(t, nil, f.config()), tenantDBs{"acme": openDB(t, map[string][]int64{"x": {1000}})}, nil)
	leaves := serve(t, f.set(t, nil, f.config()), tenantDBs{"acme": openDB(t, map[string][]int64{"y": {1000}})}, nil)
	res := &srvResolver{}
	res.set(stays, leaves)

	clock := time.Unix(1_700_000_000, 0)
	var (
		mu         sync.Mutex
		syncedFrom time.Time // start of the bucket view's last completed sync
	)
	synced := func(t time.Time) bool { mu.Lock(); defer mu.Unlock(); return syncedFrom.After(t) }
	syncStartedAt := func(t time.Time) { mu.Lock(); defer mu.Unlock(); syncedFrom = t }
	cfg := f.config("dnssrv+_http._tcp.rcv.svc")
	require.NoError(t, cfg.Validate())
	a, err := New(discard, nil, cfg, Options{HTTPClient: f.client, Resolver: res, Now: func() time.Time { return clock }, BucketSynced: synced})
	require.NoError(t, err)
	a.Refresh(context.Background())
	r := a.NewReader(tenantDBs{})
	read := func() (map[string][]sample, []string) {
		q, err := r.Querier("acme", 0, 10_000)
		require.NoError(t, err)
		return readAll(t, q)
	}
	labelWarnings := func() []string {
		q, err := r.Querier("acme", 0, 10_000)
		require.NoError(t, err)
		defer func() { require.NoError(t, q.Close()) }()
		_, ws, err := q.LabelValues(context.Background(), "__name__", nil)
		require.NoError(t, err)
		var out []string
		for _, w := range ws {
			out = append(out, w.Error())
		}
		return out
	}
	got, ws := read()
	require.Len(t, got, 2)
	require.Empty(t, ws)

	// Scaled down: gone from DNS (and stopped).
	leaves.Close()
	res.set(stays)
	clock = clock.Add(time.Second)
	a.Refresh(context.Background())
	got, ws = read()
	require.Equal(t, map[string][]sample{`{__name__="x", _id="c1"}`: {{1000, 1}}}, got)
	require.Len(t, ws, 1, "the departed peer's data is missing without a warning")
	require.Contains(t, ws[0], "peer "+host(leaves)+" unavailable, its data is missing: it left the peers")
	require.Len(t, labelWarnings(), 1)
	var gone []pushdown.Shard
	for _, s := range a.Shards() {
		if s.Name() == "peer "+host(leaves) {
			gone = append(gone, s)
		}
	}
	require.Len(t, gone, 1, "pushdown evaluates without the departed peer and no warning")
	_, err = gone[0].Eval(context.Background(), pushdown.Request{Query: "x"})
	require.True(t, errors.Is(err, pushdown.ErrUnavailable), "%v", err)

	// A sync that started before it left does not hold its upload.
	syncStartedAt(clock.Add(-time.Millisecond))
	_, ws = read()
	require.Len(t, ws, 1)
	// One that started after it left does: no warning, and forgotten.
	syncStartedAt(clock.Add(time.Millisecond))
	_, ws = read()
	require.Empty(t, ws)
	require.Empty(t, labelWarnings())
	require.Len(t, a.Shards(), 1)
	a.mu.Lock()
	require.Empty(t, a.departed)
	a.mu.Unlock()
}

// TestReturningPeerIsNotDeparted: an address back in discovery (a DNS
// answer that briefly lacked it) is read again, without a warning.
func TestReturningPeerIsNotDeparted(t *testing.T) {
	f := newFixture(t)
	b := serve(t, f.set(t, nil, f.config()), tenantDBs{"acme": openDB(t, map[string][]int64{"x": {1000}})}, nil)
	res := &srvResolver{}
	res.set(b)
	cfg := f.config("dnssrv+_http._tcp.rcv.svc")
	require.NoError(t, cfg.Validate())
	a, err := New(discard, nil, cfg, Options{HTTPClient: f.client, Resolver: res, BucketSynced: func(time.Time) bool { return false }})
	require.NoError(t, err)
	a.Refresh(context.Background())
	res.set()
	a.Refresh(context.Background())
	res.set(b)
	a.Refresh(context.Background())
	q, err := a.NewReader(tenantDBs{}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	got, ws := readAll(t, q, labels.MustNewMatcher(labels.MatchEqual, "__name__", "x"))
	require.Len(t, got, 1)
	require.Empty(t, ws)
}

// TestNoDepartureWithoutBucket: without a bucket store the departed peer's
// data is never read again; waiting for a sync would warn for good.
func TestNoDepartureWithoutBucket(t *testing.T) {
	f := newFixture(t)
	b := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(b.Close)
	res := &srvResolver{}
	res.set(b)
	cfg := f.config("dnssrv+_http._tcp.rcv.svc")
	require.NoError(t, cfg.Validate())
	a, err := New(discard, nil, cfg, Options{HTTPClient: f.client, Resolver: res})
	require.NoError(t, err)
	a.Refresh(context.Background())
	res.set()
	a.Refresh(context.Background())
	q, err := a.NewReader(tenantDBs{}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	_, ws := readAll(t, q)
	require.Empty(t, ws)
	require.Empty(t, a.Shards())
}
