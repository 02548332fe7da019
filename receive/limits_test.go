package receive

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

func manySeries(cluster string, from, to int) []prompb.TimeSeries {
	var out []prompb.TimeSeries
	for i := from; i < to; i++ {
		out = append(out, series("csv_succeeded", "_id", cluster, "name", fmt.Sprintf("op-%03d", i)))
	}
	return out
}

func TestSeriesLimitIsPartialAndSparesOthers(t *testing.T) {
	w := &fakeWriter{}
	lim := newLimiter(func(s *limits.Spec) { s.MaxSeriesPerCluster = ptr(10) })
	h := NewHandler(discard(), nil, w, lim, Options{})
	noisy := &auth.Identity{Tenant: "acme", ClusterID: "noisy"}
	calm := &auth.Identity{Tenant: "acme", ClusterID: "calm"}

	for _, tc := range []struct {
		name        string
		id          *auth.Identity
		series      []prompb.TimeSeries
		wantCode    int
		wantWritten string
	}{
		{"just under the limit", noisy, manySeries("noisy", 0, 9), 204, "9"},
		{"at the limit", noisy, manySeries("noisy", 9, 10), 204, "1"},
		{"just over: existing series flow, new ones refused", noisy, manySeries("noisy", 5, 12), 400, "5"},
		{"another cluster is unaffected", calm, manySeries("calm", 0, 10), 204, "10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := w.samples()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, newRequest(encode(t, tc.series...), tc.id))
			require.Equal(t, tc.wantCode, rec.Code, rec.Body.String())
			require.Equal(t, tc.wantWritten, strconv.Itoa(w.samples()-before))
			if tc.wantCode == 400 {
				require.Contains(t, rec.Body.String(), "max_series_per_cluster limit of 10 reached")
				require.Contains(t, rec.Body.String(), "2 of 7 samples rejected")
			}
		})
	}
	require.InDelta(t, 2, testutil.ToFloat64(h.metrics.rejected.WithLabelValues(reasonSeriesLimit)), 0)

	// Hot reload: raising the limit admits the refused series without a restart.
	var cfg limits.Config
	cfg.Defaults.MaxSeriesPerCluster = ptr(12)
	cfg.SetDefaults()
	lim.Reload(cfg)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, manySeries("noisy", 10, 12)...), noisy))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
}

func TestRateLimitAnswers429WithRetryAfter(t *testing.T) {
	w := &fakeWriter{}
	lim := newLimiter(func(s *limits.Spec) {
		s.SamplesPerSecondPerCluster = ptr(1.0)
		s.BurstPerCluster = ptr(5)
	})
	h := NewHandler(discard(), nil, w, lim, Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, manySeries("c1", 0, 5)...), id))
	require.Equal(t, http.StatusNoContent, rec.Code, "the burst is available at once")

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, manySeries("c1", 0, 5)...), id))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.NotEmpty(t, rec.Header().Get("Retry-After"))
	require.Contains(t, rec.Body.String(), "samples_per_second_per_cluster limit of 1")
	require.Len(t, w.series, 5, "nothing of a rate-limited request is written")

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, manySeries("c2", 0, 5)...), &auth.Identity{Tenant: "acme", ClusterID: "c2"}))
	require.Equal(t, http.StatusNoContent, rec.Code, "another cluster has its own bucket")
}

// TestOverBurstStoppedWhileDecodingIsCounted: a request of more samples
// than the burst admits is stopped while decoding (it could never pass),
// and refused as AllowSamples refuses it: 413 naming the limit, counted in
// the limiter's and the handler's metrics and on the status page.
func TestOverBurstStoppedWhileDecodingIsCounted(t *testing.T) {
	w := &fakeWriter{}
	lim := newLimiter(func(s *limits.Spec) {
		s.SamplesPerSecondPerCluster = ptr(1.0)
		s.BurstPerCluster = ptr(5)
	})
	lim.TrackClusters(Reasons())
	h := NewHandler(discard(), nil, w, lim, Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, manySeries("c1", 0, 8)...), &auth.Identity{Tenant: "acme", ClusterID: "c1"}))
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "burst_per_cluster limit of 5")
	require.Equal(t, 6.0, testutil.ToFloat64(h.metrics.rejected.WithLabelValues(reasonRateLimit)), "the samples up to the first past the burst")
	ts, _ := lim.Tenant("acme")
	require.Equal(t, uint64(6), ts.Refused[reasonRateLimit], "on the status page")
	require.Empty(t, w.series)
}

func TestServerSideAllowlistAndElision(t *testing.T) {
	w := &fakeWriter{}
	pol, err := NewPolicy(&Config{Allowlist: []string{`csv_succeeded`, `{__name__="alerts",alertstate="firing"}`}, ElideLabels: []string{"pod"}})
	require.NoError(t, err)
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{Policy: pol})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t,
		series("alerts", "alertstate", "firing", "pod", "p-1"),
		series("alerts", "alertstate", "pending"),
		series("csv_succeeded", "name", "x"),
		series("node_cpu_seconds_total"),
	), &auth.Identity{Tenant: "acme"}))
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Contains(t, rec.Body.String(), "not in the server-side allowlist")
	require.Len(t, w.series, 2)
	require.Equal(t, []prompb.Label{{Name: "__name__", Value: "alerts"}, {Name: "alertstate", Value: "firing"}}, w.series[0].Labels, "pod is elided")
	require.InDelta(t, 2, testutil.ToFloat64(h.metrics.rejected.WithLabelValues(reasonAllowlist)), 0)

	h.SetPolicy(&Policy{})
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("node_cpu_seconds_total")), &auth.Identity{Tenant: "acme"}))
	require.Equal(t, http.StatusNoContent, rec.Code, "a new policy applies at once")
}

func TestLabelLimits(t *testing.T) {
	lim := newLimiter(func(s *limits.Spec) {
		s.MaxLabelNamesPerSeries = ptr(3)
		s.MaxLabelNameLength = ptr(8)
		s.MaxLabelValueLength = ptr(4)
	})
	h := NewHandler(discard(), nil, &fakeWriter{}, lim, Options{})
	for _, tc := range []struct {
		name string
		ts   prompb.TimeSeries
		want int
	}{
		{"at every limit", series("up", "abcdefgh", "1234", "b", "x"), 204},
		{"too many labels", series("up", "a", "1", "b", "2", "c", "3"), 400},
		{"name too long", series("up", "abcdefghi", "1"), 400},
		{"value too long", series("up", "a", "12345"), 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, newRequest(encode(t, tc.ts), &auth.Identity{Tenant: "acme"}))
			require.Equal(t, tc.want, rec.Code, rec.Body.String())
		})
	}
}

func TestV1MetadataIsRateLimitedAndValidated(t *testing.T) {
	w := &fakeWriter{}
	lim := newLimiter(func(s *limits.Spec) {
		s.SamplesPerSecondPerCluster = ptr(0.001)
		s.BurstPerCluster = ptr(1)
	})
	h := NewHandler(discard(), nil, w, lim, Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	req := func(md ...prompb.MetricMetadata) []byte {
		raw, err := (&prompb.WriteRequest{Metadata: md}).Marshal()
		require.NoError(t, err)
		return snappy.Encode(nil, raw)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(req(
		prompb.MetricMetadata{MetricFamilyName: "ok_metric", Help: "fine"},
		prompb.MetricMetadata{MetricFamilyName: "bad name", Help: "x"},
		prompb.MetricMetadata{MetricFamilyName: "long_help", Help: strings.Repeat("h", maxHelpBytes+1)},
	), id))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.Len(t, w.meta, 1, "invalid names and oversized help are dropped")
	require.InDelta(t, 2, testutil.ToFloat64(h.metrics.rejected.WithLabelValues(reasonInvalidMetadata)), 0)

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(req(prompb.MetricMetadata{MetricFamilyName: "more", Help: "x"}), id))
	require.Equal(t, http.StatusTooManyRequests, rec.Code, "metadata-only requests count against the rate")
	require.Len(t, w.meta, 1)
}

// An erased (denied) cluster's series are refused before the limiter: they
// take none of the tenant's series budget and leave no cluster on the
// status page. A credential bound to it is refused before its body is
// read, so not even its rate bucket or in-flight count holds its id.
func TestHandlerRefusesADeniedClusterBeforeTheLimiter(t *testing.T) {
	lim := newLimiter(func(s *limits.Spec) { s.MaxSeriesPerTenant = ptr(1) })
	lim.TrackClusters(Reasons())
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, lim, Options{Denied: func(tenant, cluster string) bool { return tenant == "acme" && cluster == "erased" }})

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up"), series("up", "job", "x")), &auth.Identity{Tenant: "acme", ClusterID: "erased"}))
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Contains(t, rec.Body.String(), "cluster was erased")
	require.Contains(t, rec.Body.String(), "POST /api/v1/admin/readmit", "says how the refusal is lifted")
	require.InDelta(t, 1, testutil.ToFloat64(h.metrics.requests.WithLabelValues("/api/v1/write", "400")), 0)
	_, shown := lim.Cluster("acme", "erased")
	require.False(t, shown, "not on the status page")
	_, known := lim.Forget("acme", "erased")
	require.False(t, known, "the limiter holds nothing of it: no rate bucket, no name")

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up")), &auth.Identity{Tenant: "acme", ClusterID: "c2"}))
	require.Equal(t, http.StatusNoContent, rec.Code, "the tenant's one series is still free: %s", rec.Body)
	require.Len(t, w.series, 1)

	// A fleet token bound to no cluster: each series by its own _id.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up", "_id", "erased"), series("up", "_id", "c2")), &auth.Identity{Tenant: "acme"}))
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.InDelta(t, 1, testutil.ToFloat64(h.metrics.rejected.WithLabelValues(reasonErased)), 0)
	require.Len(t, w.series, 2, "c2's series written")
}
