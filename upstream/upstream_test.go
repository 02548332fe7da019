package upstream_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/upstream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var discard = slog.New(slog.DiscardHandler)

// fakeUpstream fails the first `fail` requests with 503, refuses bodies whose
// first series is named "bad" with 400 and records the accepted ones.
type fakeUpstream struct {
	mu       sync.Mutex
	fail     int
	failWith int      // status of the failures; 0 means 503
	got      []string // metric names, in arrival order
	tenants  []string
}

func (f *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		code := http.StatusServiceUnavailable
		if f.failWith != 0 {
			code = f.failWith
		}
		http.Error(w, "refused", code)
		return
	}
	b, _ := io.ReadAll(r.Body)
	raw, err := snappy.Decode(nil, b)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req prompb.WriteRequest
	if err := req.Unmarshal(raw); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	name := req.Timeseries[0].Labels[0].Value
	if name == "bad" {
		http.Error(w, "out of order", http.StatusBadRequest)
		return
	}
	f.got = append(f.got, name)
	f.tenants = append(f.tenants, r.Header.Get("X-Scope-OrgID"))
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeUpstream) received() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func ts(name string) []prompb.TimeSeries {
	return []prompb.TimeSeries{{
		Labels:  []prompb.Label{{Name: "__name__", Value: name}},
		Samples: []prompb.Sample{{Timestamp: 1, Value: 1}},
	}}
}

func config(url string) upstream.Config {
	c := upstream.Config{URL: url, Mode: upstream.ModeForwardOnly, TenantHeader: "X-Scope-OrgID"}
	c.SetDefaults()
	return c
}

func TestForwardOnlyRetriesInOrderAndDropsRefused(t *testing.T) {
	up := &fakeUpstream{fail: 2}
	srv := httptest.NewServer(up)
	defer srv.Close()
	reg := prometheus.NewRegistry()
	w, err := upstream.New(discard, reg, nil, t.TempDir(), config(srv.URL))
	require.NoError(t, err)
	w.NoBackoff()
	for _, n := range []string{"a", "bad", "b", "c"} {
		st, err := w.Write(context.Background(), "acme", ts(n))
		require.NoError(t, err)
		require.Equal(t, 1, st.Samples)
	}
	deliver(t, w, reg, 3)
	require.Equal(t, []string{"a", "b", "c"}, up.received())
	require.Equal(t, []string{"acme", "acme", "acme"}, up.tenants)
	require.Equal(t, 2.0, counter(t, reg, "phonehome_upstream_retries_total", ""))
	require.Equal(t, 1.0, counter(t, reg, "phonehome_upstream_dropped_samples_total", "http_4xx"))
	require.Equal(t, 3.0, counter(t, reg, "phonehome_upstream_sent_samples_total", ""))
}

// telemeter-server forwards every cluster's upload to one Thanos tenant
// (--tenant-id); upstream.tenant does the same whatever the writer's tenant.
func TestFixedUpstreamTenant(t *testing.T) {
	up := &fakeUpstream{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	reg := prometheus.NewRegistry()
	cfg := config(srv.URL)
	cfg.Tenant = "FB870BF3-9F3A-44FF-9BF7-D7A047A52F43"
	w, err := upstream.New(discard, reg, nil, t.TempDir(), cfg)
	require.NoError(t, err)
	for _, tenant := range []string{"acme", "fleet"} {
		_, err := w.Write(context.Background(), tenant, ts("up"))
		require.NoError(t, err)
	}
	deliver(t, w, reg, 2)
	require.Equal(t, []string{cfg.Tenant, cfg.Tenant}, up.tenants)
}

// deliver runs w until it has sent n samples, then stops and closes it.
func deliver(t *testing.T, w *upstream.Writer, reg *prometheus.Registry, n float64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	waitCounter(t, reg, "phonehome_upstream_sent_samples_total", n)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, w.Close())
}

func TestForwardOnlyRefusesWhenFullAndKeepsQueueAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := config("http://127.0.0.1:1/") // never reached: Run is not started
	cfg.Queue.MaxBytes = 300
	w, err := upstream.New(discard, nil, nil, dir, cfg)
	require.NoError(t, err)
	_, err = w.Write(context.Background(), "acme", ts("a"))
	require.NoError(t, err)
	var full error
	for range 10 {
		if _, full = w.Write(context.Background(), "acme", ts("b")); full != nil {
			break
		}
	}
	require.ErrorIs(t, full, upstream.ErrQueueFull)
	require.ErrorIs(t, full, storage.ErrNotReady)
	require.NoError(t, w.Close())

	up := &fakeUpstream{}
	srv := httptest.NewServer(up)
	defer srv.Close()
	cfg.URL = srv.URL
	w, err = upstream.New(discard, nil, nil, dir, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	require.Eventually(t, func() bool { return len(up.received()) > 0 }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, w.Close())
	require.Equal(t, "a", up.received()[0])
}

// fakeLocal records local writes.
type fakeLocal struct{ n int }

func (f *fakeLocal) Write(_ context.Context, _ string, s []prompb.TimeSeries) (storage.Stats, error) {
	f.n += len(s)
	return storage.Stats{Samples: len(s)}, nil
}

func TestAlsoWritesLocallyAndDropsUpstreamCopyWhenFull(t *testing.T) {
	cfg := config("http://127.0.0.1:1/")
	cfg.Mode = upstream.ModeAlso
	cfg.Queue.MaxBytes = 200
	local := &fakeLocal{}
	reg := prometheus.NewRegistry()
	w, err := upstream.New(discard, reg, local, t.TempDir(), cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	for range 10 {
		_, err := w.Write(context.Background(), "acme", ts("a"))
		require.NoError(t, err)
	}
	require.Equal(t, 10, local.n)
	require.Positive(t, counter(t, reg, "phonehome_upstream_dropped_samples_total", "queue_full"))
}

// waitCounter waits until the counter name (without labels) reaches want:
// the sender counts a delivery once its answer is read, and a test that
// cancelled as soon as the upstream saw the request would abort it first.
func waitCounter(t *testing.T, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	require.Eventually(t, func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			return false
		}
		for _, mf := range mfs {
			if mf.GetName() == name && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0].GetCounter().GetValue() >= want
			}
		}
		return false
	}, time.Minute, 10*time.Millisecond, "%s did not reach %v", name, want)
}

// counter reads a counter from reg; label is the value of its only label, if any.
func counter(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return 0
}

func TestMisconfiguredUpstreamKeepsTheData(t *testing.T) {
	for _, code := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			up := &fakeUpstream{fail: 3, failWith: code}
			srv := httptest.NewServer(up)
			defer srv.Close()
			reg := prometheus.NewRegistry()
			w, err := upstream.New(discard, reg, nil, t.TempDir(), config(srv.URL))
			require.NoError(t, err)
			w.NoBackoff()
			_, err = w.Write(context.Background(), "acme", ts("a"))
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- w.Run(ctx) }()
			require.Eventually(t, func() bool { return len(up.received()) == 1 }, 10*time.Second, 10*time.Millisecond)
			cancel()
			require.NoError(t, <-done)
			require.NoError(t, w.Close())
			require.Equal(t, 0.0, counter(t, reg, "phonehome_upstream_dropped_samples_total", "http_4xx"), "acknowledged data is never dropped for a wrong credential or URL")
		})
	}
}

// TestFailedQueueSyncCountsQueuedRecords: a record written to the queue whose
// fsync failed is delivered unless the process dies first. forward_only
// refuses the write (not durable, so not acknowledged: the client retries,
// and the second copy is a no-op upstream); also acknowledges it as the local
// write decides. Either way its samples count as queued, then as sent, and
// never as dropped.
func TestFailedQueueSyncCountsQueuedRecords(t *testing.T) {
	for _, mode := range []string{upstream.ModeForwardOnly, upstream.ModeAlso} {
		t.Run(mode, func(t *testing.T) {
			up := &fakeUpstream{}
			srv := httptest.NewServer(up)
			defer srv.Close()
			cfg := config(srv.URL)
			cfg.Mode = mode
			reg := prometheus.NewRegistry()
			local := &fakeLocal{}
			w, err := upstream.New(discard, reg, local, t.TempDir(), cfg)
			require.NoError(t, err)
			w.FailSyncs()
			_, err = w.Write(context.Background(), "acme", ts("a"))
			if mode == upstream.ModeForwardOnly {
				require.ErrorContains(t, err, "sync queue")
				require.Equal(t, 1.0, counter(t, reg, "phonehome_upstream_refused_requests_total", ""))
			} else {
				require.NoError(t, err)
				require.Equal(t, 1, local.n)
			}
			require.Equal(t, 1.0, counter(t, reg, "phonehome_upstream_queued_samples_total", ""))

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- w.Run(ctx) }()
			waitCounter(t, reg, "phonehome_upstream_sent_samples_total", 1)
			cancel()
			require.NoError(t, <-done)
			require.NoError(t, w.Close())
			require.Equal(t, []string{"a"}, up.received())
			require.Equal(t, 1.0, counter(t, reg, "phonehome_upstream_sent_samples_total", ""))
			requireNoCounter(t, reg, "phonehome_upstream_dropped_samples_total")
		})
	}
}

// requireNoCounter fails if reg has a sample of the counter name.
func requireNoCounter(t *testing.T, reg *prometheus.Registry, name string) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				require.Zero(t, m.GetCounter().GetValue(), "%s%v", name, m.GetLabel())
			}
		}
	}
}
