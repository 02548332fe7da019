package receive

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alecthomas/units"
	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeWriter records what it is asked to write. failWith, when set, is
// returned for every call; partial rejects samples whose value is 13.
type fakeWriter struct {
	mu       sync.Mutex
	tenants  []string
	series   []prompb.TimeSeries
	meta     []prompb.MetricMetadata
	failWith error
}

func (f *fakeWriter) WriteFamilyMetadata(_ string, md []prompb.MetricMetadata) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.meta = append(f.meta, md...)
	return nil
}

func (f *fakeWriter) Write(_ context.Context, tenant string, series []prompb.TimeSeries) (storage.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failWith != nil {
		return storage.Stats{}, f.failWith
	}
	var st storage.Stats
	rejected := 0
	for _, ts := range series {
		// Deep copy: the strings of series alias the request's buffer.
		cp := prompb.TimeSeries{}
		for _, l := range ts.Labels {
			cp.Labels = append(cp.Labels, prompb.Label{Name: strings.Clone(l.Name), Value: strings.Clone(l.Value)})
		}
		for _, e := range ts.Exemplars {
			ce := prompb.Exemplar{Value: e.Value, Timestamp: e.Timestamp}
			for _, l := range e.Labels {
				ce.Labels = append(ce.Labels, prompb.Label{Name: strings.Clone(l.Name), Value: strings.Clone(l.Value)})
			}
			cp.Exemplars = append(cp.Exemplars, ce)
		}
		for _, s := range ts.Samples {
			if s.Value == 13 {
				rejected++
				continue
			}
			cp.Samples = append(cp.Samples, s)
			st.Samples++
		}
		st.Histograms += len(ts.Histograms)
		f.series = append(f.series, cp)
		f.tenants = append(f.tenants, tenant)
	}
	if rejected > 0 {
		return st, &storage.PartialError{Rejected: rejected, Err: promstorage.ErrOutOfOrderSample}
	}
	return st, nil
}

// samples counts the samples written so far.
func (f *fakeWriter) samples() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, ts := range f.series {
		n += len(ts.Samples)
	}
	return n
}

func series(name string, extra ...string) prompb.TimeSeries {
	ls := []prompb.Label{{Name: "__name__", Value: name}}
	for i := 0; i+1 < len(extra); i += 2 {
		ls = append(ls, prompb.Label{Name: extra[i], Value: extra[i+1]})
	}
	return prompb.TimeSeries{Labels: ls, Samples: []prompb.Sample{{Value: 1, Timestamp: 1000}}}
}

func encode(t testing.TB, ts ...prompb.TimeSeries) []byte {
	t.Helper()
	raw, err := (&prompb.WriteRequest{Timeseries: ts}).Marshal()
	require.NoError(t, err)
	return snappy.Encode(nil, raw)
}

func newRequest(body []byte, id *auth.Identity) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/api/v1/write", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/x-protobuf")
	r.Header.Set("Content-Encoding", "snappy")
	r.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	if id != nil {
		r = r.WithContext(auth.WithIdentity(r.Context(), *id))
	}
	return r
}

func TestHandlerStatus(t *testing.T) {
	acme := &auth.Identity{Tenant: "acme"}
	valid := encode(t, series("up", "job", "a"))
	longValue := strings.Repeat("v", limits.DefaultTenantLimits().MaxLabelValueLength+1)

	for _, tc := range []struct {
		name    string
		req     func() *http.Request
		want    int
		samples string
		body    string
	}{
		{"valid", func() *http.Request { return newRequest(valid, acme) }, 204, "1", ""},
		{"no encoding header is snappy", func() *http.Request {
			r := newRequest(valid, acme)
			r.Header.Del("Content-Encoding")
			return r
		}, 204, "1", ""},
		{"proto param v1", func() *http.Request {
			r := newRequest(valid, acme)
			r.Header.Set("Content-Type", "application/x-protobuf;proto=prometheus.WriteRequest")
			return r
		}, 204, "1", ""},
		{"json content type", func() *http.Request {
			r := newRequest(valid, acme)
			r.Header.Set("Content-Type", "application/json")
			return r
		}, 415, "0", "application/x-protobuf"},
		{"unknown proto", func() *http.Request {
			r := newRequest(valid, acme)
			r.Header.Set("Content-Type", "application/x-protobuf;proto=foo.Bar")
			return r
		}, 415, "0", "proto"},
		{"gzip encoding", func() *http.Request {
			r := newRequest(valid, acme)
			r.Header.Set("Content-Encoding", "gzip")
			return r
		}, 415, "0", "snappy"},
		{"garbage body", func() *http.Request { return newRequest([]byte("garbage!"), acme) }, 400, "0", "snappy"},
		{"truncated snappy", func() *http.Request { return newRequest(valid[:len(valid)-3], acme) }, 400, "0", "snappy"},
		{"snappy of garbage protobuf", func() *http.Request { return newRequest(snappy.Encode(nil, []byte{0xff, 0xff, 0xff}), acme) }, 400, "0", "protobuf"},
		{"huge declared decoded length", func() *http.Request {
			return newRequest([]byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0x00}, acme) // varint 4 GiB
		}, 413, "0", "decoded size"},
		{"oversized body", func() *http.Request {
			return newRequest(make([]byte, limits.DefaultTenantLimits().MaxBodyBytes+1), acme)
		}, 413, "0", "exceeds"},
		{"no identity", func() *http.Request { return newRequest(valid, nil) }, 500, "0", ""},
		{"no metric name", func() *http.Request {
			return newRequest(encode(t, prompb.TimeSeries{Labels: []prompb.Label{{Name: "job", Value: "a"}}, Samples: []prompb.Sample{{Value: 1}}}), acme)
		}, 400, "0", "no metric name"},
		{"unsorted labels are sorted", func() *http.Request { return newRequest(encode(t, series("up", "z", "1", "a", "2")), acme) }, 204, "1", ""},
		{"duplicate labels", func() *http.Request { return newRequest(encode(t, series("up", "a", "1", "a", "2")), acme) }, 400, "0", "duplicate"},
		{"duplicate labels, unsorted", func() *http.Request { return newRequest(encode(t, series("up", "b", "1", "a", "2", "b", "3")), acme) }, 400, "0", "duplicate"},
		{"empty label name, unsorted", func() *http.Request { return newRequest(encode(t, series("up", "b", "1", "", "2")), acme) }, 400, "0", "empty label name"},
		{"empty label name", func() *http.Request {
			ts := series("up")
			ts.Labels = append([]prompb.Label{{Name: "", Value: "x"}}, ts.Labels...)
			return newRequest(encode(t, ts), acme)
		}, 400, "0", "empty label name"},
		{"bad label name", func() *http.Request { return newRequest(encode(t, series("up", "a-b", "1")), acme) }, 400, "0", "invalid label name"},
		{"bad metric name", func() *http.Request { return newRequest(encode(t, series("1up")), acme) }, 400, "0", "invalid metric name"},
		{"label value too long", func() *http.Request { return newRequest(encode(t, series("up", "a", longValue)), acme) }, 400, "0", "limit"},
		{"no samples", func() *http.Request {
			return newRequest(encode(t, prompb.TimeSeries{Labels: []prompb.Label{{Name: "__name__", Value: "up"}}}), acme)
		}, 400, "0", "no samples"},
		{"partial: one bad series, one good", func() *http.Request {
			return newRequest(encode(t, series("1bad"), series("up", "job", "b")), acme)
		}, 400, "1", "rest were written"},
		{"partial from storage", func() *http.Request {
			ts := series("up")
			ts.Samples = append(ts.Samples, prompb.Sample{Value: 13, Timestamp: 2000})
			return newRequest(encode(t, ts), acme)
		}, 400, "1", "out of order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &fakeWriter{}
			h := NewHandler(discard(), nil, w, newLimiter(nil), Options{})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, tc.req())
			require.Equal(t, tc.want, rec.Code, rec.Body.String())
			require.Equal(t, tc.samples, strconv.Itoa(w.samples()))
			if got := rec.Header().Get(headerSamplesWritten); got != "" { // 1.0 responses carry none
				require.Equal(t, "0", got, "only requests refused before their version was known carry counts")
			}
			require.Contains(t, rec.Body.String(), tc.body)
		})
	}
}

// TestHandlerWrittenCountsFor2Only: 2.0 responses carry the written counts
// the 2.0 spec asks for; 1.0 responses carry none, as Prometheus' (the
// compliance suite's RW1 case checks it).
func TestHandlerWrittenCountsFor2Only(t *testing.T) {
	id := &auth.Identity{Tenant: "acme"}
	h := NewHandler(discard(), nil, &fakeWriter{}, newLimiter(nil), Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up", "job", "a")), id))
	require.Equal(t, http.StatusNoContent, rec.Code)
	for _, hdr := range []string{headerSamplesWritten, headerHistogramsWritten, headerExemplarsWritten} {
		require.Empty(t, rec.Header().Values(hdr), "1.0: %s", hdr)
	}
	b := newV2()
	b.series(labels.FromStrings("__name__", "up", "job", "b"), func(ts *writev2.TimeSeries) { ts.Samples = []writev2.Sample{{Value: 1, Timestamp: 1000}} })
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequestV2(b.encode(t), id))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.Equal(t, "1", rec.Header().Get(headerSamplesWritten))
	require.Equal(t, "0", rec.Header().Get(headerHistogramsWritten))
	require.Equal(t, "0", rec.Header().Get(headerExemplarsWritten))
}

func TestHandlerNotReady(t *testing.T) {
	h := NewHandler(discard(), nil, &fakeWriter{}, newLimiter(nil), Options{Ready: func() bool { return false }})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up")), &auth.Identity{Tenant: "a"}))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.NotEmpty(t, rec.Header().Get("Retry-After"))

	h = NewHandler(discard(), nil, &fakeWriter{failWith: storage.ErrNotReady}, newLimiter(nil), Options{})
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up")), &auth.Identity{Tenant: "a"}))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)

	h = NewHandler(discard(), nil, &fakeWriter{failWith: fmt.Errorf("disk on fire")}, newLimiter(nil), Options{})
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up")), &auth.Identity{Tenant: "a"}))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
}

func TestHandlerWritesTenantAndBindsCluster(t *testing.T) {
	w := &fakeWriter{}
	reg := prometheus.NewRegistry()
	h := NewHandler(discard(), reg, w, newLimiter(nil), Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}

	stale := series("up", "job", "x")
	stale.Samples[0].Value = math.Float64frombits(value.StaleNaN)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, stale, series("up", "_id", "c1", "job", "y"), series("up", "_id", "c2"), series("up", "empty", "")), id))
	require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String()) // c2 is refused
	require.Contains(t, rec.Body.String(), "does not match the authenticated cluster")

	require.Len(t, w.series, 3)
	for i, ts := range w.series {
		require.Equal(t, "acme", w.tenants[i])
		var got string
		for _, l := range ts.Labels {
			require.NotEmpty(t, l.Value, "empty-valued labels are dropped")
			if l.Name == "_id" {
				got = l.Value
			}
		}
		require.Equal(t, "c1", got, "series %d is bound to the credential's cluster", i)
	}
	require.Equal(t, value.StaleNaN, math.Float64bits(w.series[0].Samples[0].Value), "stale marker passes bit-exact")
	require.InDelta(t, 1, testutil.ToFloat64(h.metrics.rejected.WithLabelValues(reasonClusterMismatch)), 0)
	require.InDelta(t, 3, testutil.ToFloat64(h.metrics.samples.WithLabelValues("accepted")), 0)
	require.InDelta(t, 1, testutil.ToFloat64(h.metrics.requests.WithLabelValues("/api/v1/write", "400")), 0)
}

func TestHandlerKeepsServingAfterBadInput(t *testing.T) {
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{})
	id := &auth.Identity{Tenant: "a"}
	for _, body := range [][]byte{nil, []byte("x"), {0xff, 0xff, 0xff, 0xff, 0x0f}, make([]byte, 1024)} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(body, id))
		require.Less(t, rec.Code, 500)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up")), id))
	require.Equal(t, http.StatusNoContent, rec.Code)
}

func FuzzDecodeWriteRequest(f *testing.F) {
	f.Add(encode(f, series("up", "job", "a"), series("csv_succeeded", "name", "x", "version", "1.0")))
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add(snappy.Encode(nil, []byte{0x0a, 0x02, 0x0a, 0x00}))
	h := NewHandler(discard(), nil, discardWriter{}, newLimiter(func(s *limits.Spec) {
		s.MaxBodyBytes, s.MaxDecodedBytes = ptr(units.Base2Bytes(1<<16)), ptr(units.Base2Bytes(1<<20))
	}), Options{})
	id := &auth.Identity{Tenant: "a", ClusterID: "c"}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(body, id))
		if rec.Code >= 500 {
			t.Fatalf("client input answered %d: %s", rec.Code, rec.Body)
		}
	})
}

func TestHandlerOverwritesForeignClusterIDWhenConfigured(t *testing.T) {
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{OverwriteClusterID: true})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up", "_id", "other")), &auth.Identity{Tenant: "acme", ClusterID: "c1"}))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.Len(t, w.series, 1)
	require.Contains(t, w.series[0].Labels, prompb.Label{Name: "_id", Value: "c1"})
}

func TestHandlerKeepsV1MetadataInsideTheAllowlist(t *testing.T) {
	w := &fakeWriter{}
	pol, err := NewPolicy(&Config{Allowlist: []string{"csv_succeeded"}})
	require.NoError(t, err)
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{Policy: pol})
	raw, err := (&prompb.WriteRequest{Metadata: []prompb.MetricMetadata{
		{MetricFamilyName: "csv_succeeded", Type: prompb.MetricMetadata_GAUGE, Help: "1 if the CSV succeeded"},
		{MetricFamilyName: "secret_internal_metric", Type: prompb.MetricMetadata_COUNTER, Help: "not allowlisted"},
	}}).Marshal()
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(snappy.Encode(nil, raw), &auth.Identity{Tenant: "acme"}))
	require.Equal(t, http.StatusNoContent, rec.Code, "a metadata-only request writes no samples and succeeds")
	require.Len(t, w.meta, 1)
	require.Equal(t, "csv_succeeded", w.meta[0].MetricFamilyName)
}

// blockingWriter holds every write until released.
type blockingWriter struct {
	fakeWriter
	entered, release chan struct{}
}

func (b *blockingWriter) Write(ctx context.Context, tenant string, series []prompb.TimeSeries) (storage.Stats, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.fakeWriter.Write(ctx, tenant, series)
}

// within receives from c, or fails the test after 10s.
func within[T any](t *testing.T, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out")
		panic("unreachable")
	}
}

// TestHandlerMaxInflight: past Options.MaxInflight requests being served,
// across clusters, a write is refused with 503 and Retry-After before its
// body is read; once one ends, writes are served again.
func TestHandlerMaxInflight(t *testing.T) {
	w := &blockingWriter{entered: make(chan struct{}, 4), release: make(chan struct{}, 4)}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{MaxInflight: 2})
	serve := func(c string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(encode(t, series("up", "_id", c)), &auth.Identity{Tenant: "a", ClusterID: c}))
		return rec.Code
	}
	codes := make(chan int, 2)
	for _, c := range []string{"c1", "c2"} {
		go func() { codes <- serve(c) }()
		within(t, w.entered)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up", "_id", "c3")), &auth.Identity{Tenant: "a", ClusterID: "c3"}))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.NotEmpty(t, rec.Header().Get("Retry-After"))
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.overloaded.WithLabelValues(limitRequests)))
	require.Equal(t, 2.0, testutil.ToFloat64(h.metrics.inflight))

	for range 3 { // the two held writes, and c3's below
		w.release <- struct{}{}
	}
	require.Equal(t, http.StatusNoContent, within(t, codes))
	require.Equal(t, http.StatusNoContent, within(t, codes))
	require.Equal(t, http.StatusNoContent, serve("c3"))
	require.Zero(t, testutil.ToFloat64(h.metrics.inflight))
}

// TestCountUnauthenticatedByStatus: refusals are counted under the status
// auth.Middleware answered them with, not all as 401, and under the
// endpoint they came to.
func TestCountUnauthenticatedByStatus(t *testing.T) {
	h := NewHandler(discard(), nil, &fakeWriter{}, newLimiter(nil), Options{})
	for _, err := range []error{auth.ErrUnauthorized, auth.ErrForbidden, fmt.Errorf("webhook: %w", auth.ErrUpstream)} {
		rec := httptest.NewRecorder()
		auth.Middleware(refusing{err}, auth.PermWrite, h.CountUnauthenticated, h).ServeHTTP(rec, newRequest(nil, nil))
		require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues("/api/v1/write", strconv.Itoa(rec.Code))), err.Error())
	}
	require.Equal(t, 3.0, testutil.ToFloat64(h.metrics.unauthenticated))
	for _, path := range []string{"/upload", "/metrics/v1/receive"} {
		r := newRequest(nil, nil)
		r.URL.Path = path
		auth.Middleware(refusing{auth.ErrUnauthorized}, auth.PermWrite, h.CountUnauthenticated, h).ServeHTTP(httptest.NewRecorder(), r)
		require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues(path, "401")), path)
	}
}

// TestRequestsCountedByEndpoint: an SRE moving clusters from Telemeter's
// endpoints to remote write tells the paths apart in
// phonehome_receive_requests_total{handler}.
func TestRequestsCountedByEndpoint(t *testing.T) {
	h := NewHandler(discard(), nil, &fakeWriter{}, newLimiter(nil), Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	h.ServeHTTP(httptest.NewRecorder(), newRequest(encode(t, series("up", "_id", "c1")), id))
	rec := httptest.NewRecorder()
	h.ServeUpload(rec, uploadRequest(framed(t, delimited(t, gauge("up", 2, 2000, "job", "a"))), id))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues("/api/v1/write", "204")))
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues("/upload", "200")))
}

type refusing struct{ err error }

func (r refusing) Authenticate(*http.Request) (auth.Identity, error) { return auth.Identity{}, r.err }
