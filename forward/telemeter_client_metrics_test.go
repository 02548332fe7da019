package forward

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// sumOf sums every series of the family name in reg, as the PromQL
// sum(...) of cluster-monitoring-operator's rules does; ok is false when
// reg has no such family (the rules then see no data).
func sumOf(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (v float64, ok bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				v += m.Counter.GetValue()
			case m.Gauge != nil:
				v += m.Gauge.GetValue()
			}
		}
		return v, true
	}
	return 0, false
}

// TestTelemeterClientMetricsForCMORules: cluster-monitoring-operator's
// PrometheusRule for telemeter-client records
// cluster:telemetry_selected_series:count (itself in the telemetry
// allowlist) as max(federate_samples - federate_filtered_samples), and
// alerts TelemeterClientFailures on
// rate(federate_requests_failed_total) / rate(federate_requests_total).
// The forwarder in telemeter-client's Deployment must export them.
func TestTelemeterClientMetricsForCMORules(t *testing.T) {
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	recv := newFakeReceiver(t, http.StatusServiceUnavailable)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{}, FederateOptions{})
	for _, name := range []string{"federate_requests_total", "federate_requests_failed_total"} {
		v, ok := sumOf(t, h.reg, name, nil)
		require.True(t, ok, "%s is exported from the start: the alert's rate() needs it", name)
		require.Zero(t, v)
	}

	require.NoError(t, h.f.Collect(context.Background()))
	h.deliverAll(t) // a 503, then accepted
	samples, ok := sumOf(t, h.reg, "federate_samples", nil)
	require.True(t, ok, "federate_samples")
	filtered, ok := sumOf(t, h.reg, "federate_filtered_samples", nil)
	require.True(t, ok, "federate_filtered_samples")
	require.Equal(t, 300.0, samples, "samples in the last federation")
	require.Equal(t, 224.0, samples-filtered, "cluster:telemetry_selected_series:count: the samples sent")

	total, _ := sumOf(t, h.reg, "federate_requests_total", nil)
	failed, _ := sumOf(t, h.reg, "federate_requests_failed_total", nil)
	require.Equal(t, 3.0, total, "one federation and two delivery attempts")
	require.Equal(t, 1.0, failed, "the 503")
	v, _ := sumOf(t, h.reg, "federate_requests_failed_total", map[string]string{"type": "send"})
	require.Equal(t, 1.0, v)

	// A failed federation is a failed request too; the gauges keep the last
	// successful federation's values, as telemeter-client's do.
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	h2 := newHarness(t, down.URL, recv, t.TempDir(), Options{}, FederateOptions{})
	require.Error(t, h2.f.Collect(context.Background()))
	v, _ = sumOf(t, h2.reg, "federate_requests_failed_total", map[string]string{"type": "federate"})
	require.Equal(t, 1.0, v)
	v, _ = sumOf(t, h2.reg, "federate_requests_total", map[string]string{"type": "federate"})
	require.Equal(t, 1.0, v)
}
