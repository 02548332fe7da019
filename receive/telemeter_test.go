package receive

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/forward"
)

// An upload is stored at the time it is received, whatever the cluster's
// clock says, as telemeter-server stores it; the forwarder's header keeps
// the samples' own timestamps.
func TestServeUploadStoresAtReceiveTime(t *testing.T) {
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	now := time.Now()
	ahead, behind := now.Add(15*time.Minute).UnixMilli(), now.Add(-7*time.Hour).UnixMilli()
	body := framed(t, delimited(t, gauge("ahead", 1, ahead), gauge("behind", 2, behind), gauge("exact", 3, now.UnixMilli())))

	rec := httptest.NewRecorder()
	h.ServeUpload(rec, uploadRequest(body, id))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Len(t, w.series, 3)
	for _, ts := range w.series {
		require.InDelta(t, now.UnixMilli(), ts.Samples[0].Timestamp, float64(time.Minute.Milliseconds()), "%v stored at the receive time", ts.Labels)
	}
	for tense, want := range map[string]float64{"past": 1, "present": 1, "future": 1} {
		require.InDelta(t, want, testutil.ToFloat64(h.metrics.restamped.WithLabelValues(tense)), 0, tense)
	}

	w.series = nil
	kept := uploadRequest(framed(t, delimited(t, gauge("queued", 4, behind+1), gauge("queued", 5, behind+2))), id)
	kept.Header.Set(forward.HeaderTimestamps, forward.TimestampsSource)
	rec = httptest.NewRecorder()
	h.ServeUpload(rec, kept)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, []int64{behind + 1, behind + 2}, []int64{w.series[0].Samples[0].Timestamp, w.series[1].Samples[0].Timestamp}, "the forwarder's own timestamps kept")
}

// On both of Telemeter's paths a series outside the allowlist is dropped
// and counted, and the request succeeds; /api/v1/write still answers 400.
func TestTelemeterPathsDropWhatTheAllowlistRefuses(t *testing.T) {
	pol, err := NewPolicy(&Config{Allowlist: []string{"kept"}})
	require.NoError(t, err)
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{Policy: pol})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}

	rec := httptest.NewRecorder()
	h.ServeUpload(rec, uploadRequest(framed(t, delimited(t, gauge("kept", 1, 0), gauge("other", 1, 0))), id))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, "2", rec.Header().Get(headerSamplesWritten), "the dropped sample is answered as written (README)")

	body := encode(t, series("kept"), series("other"))
	rec = httptest.NewRecorder()
	h.ServeTelemeterWrite(rec, newRequest(body, id))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(body, id))
	require.Equal(t, http.StatusBadRequest, rec.Code, "remote-write keeps refusing visibly")
	require.Contains(t, rec.Body.String(), "not in the server-side allowlist")

	require.Len(t, w.series, 3, "kept, three times")
	require.InDelta(t, 3, testutil.ToFloat64(h.metrics.rejected.WithLabelValues(reasonAllowlist)), 0, "every refusal counted")
}

// Prometheus' two replicas both remote-write a cluster's telemetry: one is
// written, without its replica label; the other is answered as written.
func TestTelemeterWriteElectsOneReplica(t *testing.T) {
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{Telemeter: TelemeterOptions{ReplicaLabel: DefaultReplicaLabel, ReplicaFailover: time.Hour}})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	send := func(serve func(http.ResponseWriter, *http.Request), replica string, v float64) int {
		ts := series("cluster_version", "prometheus", "openshift-monitoring/k8s", "prometheus_replica", replica)
		ts.Samples[0].Value = v
		rec := httptest.NewRecorder()
		serve(rec, newRequest(encode(t, ts), id))
		return rec.Code
	}
	require.Equal(t, http.StatusNoContent, send(h.ServeTelemeterWrite, "prometheus-k8s-0", 1))
	require.Equal(t, http.StatusNoContent, send(h.ServeTelemeterWrite, "prometheus-k8s-1", 2), "the other replica: answered as written")
	require.Equal(t, http.StatusNoContent, send(h.ServeTelemeterWrite, "prometheus-k8s-0", 3))
	require.Equal(t, []string{
		"__name__=cluster_version,_id=c1,prometheus=openshift-monitoring/k8s 1@1000",
		"__name__=cluster_version,_id=c1,prometheus=openshift-monitoring/k8s 3@1000",
	}, seriesStrings(w.series))
	require.InDelta(t, 1, testutil.ToFloat64(h.metrics.replicaDropped), 0)

	// /upload: whichever replica federation reached, one series.
	w.series = nil
	for _, r := range []string{"prometheus-k8s-0", "prometheus-k8s-1"} {
		rec := httptest.NewRecorder()
		h.ServeUpload(rec, uploadRequest(framed(t, delimited(t, gauge("up", 1, 0, "prometheus_replica", r))), id))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	}
	require.Equal(t, "__name__=up,_id=c1", labelString(w.series[0]))
	require.Equal(t, "__name__=up,_id=c1", labelString(w.series[1]))

	// /api/v1/write leaves the label alone.
	w.series = nil
	require.Equal(t, http.StatusNoContent, send(h.ServeHTTP, "prometheus-k8s-1", 4))
	require.Contains(t, labelString(w.series[0]), "prometheus_replica=prometheus-k8s-1")
}

func labelString(ts prompb.TimeSeries) string {
	s := seriesStrings([]prompb.TimeSeries{{Labels: ts.Labels}})
	return s[0]
}

func TestReplicaTrackerFailsOver(t *testing.T) {
	tr := newReplicaTracker(time.Minute)
	t0 := time.Unix(1_000_000, 0)
	for _, step := range []struct {
		tenant, cluster, replica string
		at                       time.Duration
		ok, failedOver           bool
	}{
		{"acme", "c1", "a", 0, true, false},                  // first seen: elected
		{"acme", "c1", "b", 30 * time.Second, false, false},  // a sent 30s ago
		{"acme", "c2", "b", 30 * time.Second, true, false},   // clusters apart
		{"other", "c1", "b", 30 * time.Second, true, false},  // tenants apart
		{"acme", "c1", "a", 50 * time.Second, true, false},   // a keeps it
		{"acme", "c1", "b", 109 * time.Second, false, false}, // a silent 59s
		{"acme", "c1", "b", 111 * time.Second, true, true},   // a silent 61s: b takes over
		{"acme", "c1", "a", 112 * time.Second, false, false}, // and keeps it
		{"acme", "c1", "a", 10 * time.Minute, true, false},   // b long gone (swept): a again
		{"acme", "c1", "b", 10*time.Minute + time.Second, false, false},
	} {
		ok, failedOver := tr.accept(step.tenant, step.cluster, step.replica, t0.Add(step.at))
		require.Equal(t, step.ok, ok, "%+v", step)
		require.Equal(t, step.failedOver, failedOver, "%+v", step)
	}
	require.Len(t, tr.elected, 1, "the silent clusters were swept")
}

// Remote-write 2.0 answers carry the counts written, and Prometheus takes a
// shortfall for a failure: what Telemeter's path drops on purpose (the other
// replica's copy, allowlist misses) is reported as written.
func TestTelemeterWriteReportsDroppedAsWrittenInV2(t *testing.T) {
	pol, err := NewPolicy(&Config{Allowlist: []string{"kept"}})
	require.NoError(t, err)
	h := NewHandler(discard(), nil, &fakeWriter{}, newLimiter(nil), Options{Policy: pol, Telemeter: TelemeterOptions{ReplicaLabel: DefaultReplicaLabel, ReplicaFailover: time.Hour}})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	send := func(replica string) *httptest.ResponseRecorder {
		req := newV2()
		for _, name := range []string{"kept", "other"} {
			req.series(labels.FromStrings("__name__", name, "prometheus_replica", replica), func(ts *writev2.TimeSeries) {
				ts.Samples = []writev2.Sample{{Value: 1, Timestamp: time.Now().UnixMilli()}}
			})
		}
		rec := httptest.NewRecorder()
		h.ServeTelemeterWrite(rec, newRequestV2(req.encode(t), id))
		return rec
	}
	for _, replica := range []string{"prometheus-k8s-0", "prometheus-k8s-1"} { // elected, then dropped
		rec := send(replica)
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
		require.Equal(t, "2", rec.Header().Get(headerSamplesWritten), "%s: both samples reported written", replica)
	}
}

// telemeter.replica_label: "" keeps the label and writes every replica, as
// the README promises.
func TestTelemeterWriteWithoutReplicaLabel(t *testing.T) {
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{Telemeter: TelemeterOptions{ReplicaFailover: time.Hour}})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	for _, r := range []string{"prometheus-k8s-0", "prometheus-k8s-1"} {
		rec := httptest.NewRecorder()
		h.ServeTelemeterWrite(rec, newRequest(encode(t, series("up", "prometheus_replica", r)), id))
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	}
	require.Len(t, w.series, 2, "both replicas written")
	require.Contains(t, labelString(w.series[1]), "prometheus_replica=prometheus-k8s-1")
}
