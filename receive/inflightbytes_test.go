package receive

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// TestHandlerMaxInflightBytes: a write that would take the memory held by
// the requests in flight past Options.MaxInflightBytes is refused with 503
// and Retry-After once its wait runs out, counted under limit="bytes"; once
// the holder is answered, the same write is served, and nothing stays
// reserved.
func TestHandlerMaxInflightBytes(t *testing.T) {
	w := &blockingWriter{entered: make(chan struct{}, 2), release: make(chan struct{}, 2)}
	reg := prometheus.NewRegistry()
	var log bytes.Buffer
	h := NewHandler(slog.New(slog.NewTextHandler(&log, nil)), reg, w, newLimiter(nil), Options{MaxInflightBytes: 1 << 20})
	require.Equal(t, 5*time.Second, h.bytes.wait, "a write waits up to 5s (--receive.max-inflight-bytes' help, the README)")
	h.bytes.wait = time.Millisecond // not the 5s a write waits in production
	serve := func(c string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(encode(t, manySeries(c, 0, 2000)...), &auth.Identity{Tenant: "a", ClusterID: c}))
		return rec
	}
	codes := make(chan int, 1)
	go func() { codes <- serve("c1").Code }()
	within(t, w.entered)
	held := h.bytes.used.Load()
	require.Greater(t, held, int64(512<<10), "a held 2000-series request reserves its decoded structures")
	require.Equal(t, float64(held), gathered(t, reg, "phonehome_receive_inflight_bytes"))

	rec := serve("c2")
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "hold too much memory")
	require.Equal(t, "5", rec.Header().Get("Retry-After"), "as long as a write waits its turn (inflightBytesWait)")
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.overloaded.WithLabelValues(limitBytes)))
	require.Zero(t, testutil.ToFloat64(h.metrics.overloaded.WithLabelValues(limitRequests)))
	require.Equal(t, held, h.bytes.used.Load(), "a refused request returns what it reserved")
	require.NotContains(t, log.String(), "level=ERROR", "an overload is counted, not logged as a failure per write")

	w.release <- struct{}{}
	require.Equal(t, http.StatusNoContent, within(t, codes))
	w.release <- struct{}{}
	require.Equal(t, http.StatusNoContent, serve("c2").Code)
	require.Zero(t, h.bytes.used.Load())
}

// TestHandlerMaxInflightBytesAlone: a request larger than the whole budget
// is served when no other request holds memory, so a budget set below one
// request's size delays it instead of refusing it forever.
func TestHandlerMaxInflightBytesAlone(t *testing.T) {
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{MaxInflightBytes: 64 << 10})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, manySeries("c1", 0, 2000)...), &auth.Identity{Tenant: "a", ClusterID: "c1"}))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.Equal(t, 2000, w.samples())
	require.Zero(t, h.bytes.used.Load())
}

// TestExpansionReservesAsItSpends: the expansion budget asks the
// reservation for more only when what it spent passes what it holds, and
// its own bound still applies with a reservation.
func TestExpansionReservesAsItSpends(t *testing.T) {
	pool := &inflightBytes{max: 1 << 30}
	res := &reservation{pool: pool}
	require.NoError(t, res.buffer(1000))
	e := newExpansion(1000, 24, 0, res)
	require.Equal(t, int64(reserveStep), pool.used.Load())
	for range 1000 {
		require.NoError(t, e.spend(64))
	}
	spent := int64(1000 + 64*1000)
	require.GreaterOrEqual(t, res.held, spent)
	require.Less(t, res.held, spent+spent/4+reserveStep, "grows by steps, not by the worst case")
	require.ErrorIs(t, e.spend(24*1000+expansionSlack), errExpands)
	res.release()
	require.Zero(t, pool.used.Load())

	// Without a pool nothing is reserved, and the bound is unchanged.
	e = newExpansion(1000, 24, 0, &reservation{})
	require.NoError(t, e.spend(24*1000+expansionSlack))
	require.ErrorIs(t, e.spend(1), errExpands)
}

// TestInflightBytesTake: past max, a request is refused only while others
// hold memory.
func TestInflightBytesTake(t *testing.T) {
	b := &inflightBytes{max: 100} // no wait: what does not fit is refused at once
	first, second := &reservation{pool: b}, &reservation{pool: b}
	require.True(t, b.take(first, 150), "alone")
	require.False(t, b.take(second, 10), "another one holds 150")
	require.True(t, b.take(first, 10), "the holder itself may grow")
	first.release()
	first = &reservation{pool: b}
	require.True(t, b.take(first, 60))
	require.True(t, b.take(second, 40))
	require.False(t, b.take(&reservation{pool: b}, 1))
	require.Equal(t, int64(100), b.used.Load())
	require.Zero(t, b.waiting())
}

// gathered is the value of reg's unlabelled gauge name.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not registered", name)
	return 0
}

// TestHandlerMaxInflightBytesUndeclaredBody: a body without Content-Length
// is reserved as it is read, and refused mid-read with 503 (not as a bad
// body) while another write holds the budget.
func TestHandlerMaxInflightBytesUndeclaredBody(t *testing.T) {
	w := &blockingWriter{entered: make(chan struct{}, 2), release: make(chan struct{}, 2)}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{MaxInflightBytes: reserveStep})
	h.bytes.wait = time.Millisecond
	codes := make(chan int, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(encode(t, series("up", "_id", "c1")), &auth.Identity{Tenant: "a", ClusterID: "c1"}))
		codes <- rec.Code
	}()
	within(t, w.entered)
	require.GreaterOrEqual(t, h.bytes.used.Load(), int64(reserveStep))

	// A body that never ends: only a refusal while reading answers it.
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = pw.Write(make([]byte, 4096)) }()
	req := newRequest(nil, &auth.Identity{Tenant: "a", ClusterID: "c2"})
	req.Body, req.ContentLength = pr, -1
	rec := httptest.NewRecorder()
	answered := make(chan struct{})
	go func() { h.ServeHTTP(rec, req); close(answered) }()
	within(t, answered)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, errOverloadedBytes.Error()+"\n", rec.Body.String())

	w.release <- struct{}{}
	require.Equal(t, http.StatusNoContent, within(t, codes))
	require.Zero(t, h.bytes.used.Load())
}
