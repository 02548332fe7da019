package forward

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// telemeterClientMetrics are telemeter-client's own metrics under its names,
// because cluster-monitoring-operator's PrometheusRule for the
// telemeter-client Deployment reads them: the recording rule
// cluster:telemetry_selected_series:count (itself in the telemetry
// allowlist) is max(federate_samples - federate_filtered_samples), and the
// TelemeterClientFailures alert is the rate of federate_requests_failed_total
// over federate_requests_total. Without them a cluster running the forwarder
// sends no such series and that alert can never fire.
type telemeterClientMetrics struct {
	samples  prometheus.Gauge
	filtered prometheus.Gauge
	requests *prometheus.CounterVec // by type: federate (a collection cycle) or send (a delivery attempt)
	failed   *prometheus.CounterVec
}

// Values of the type label of the request counters.
const (
	requestFederate = "federate"
	requestSend     = "send"
)

func newTelemeterClientMetrics(f promauto.Factory) telemeterClientMetrics {
	m := telemeterClientMetrics{
		samples: f.NewGauge(prometheus.GaugeOpts{
			Name: "federate_samples", Help: "Samples read from /federate in the last successful cycle (telemeter-client's name).",
		}),
		filtered: f.NewGauge(prometheus.GaugeOpts{
			Name: "federate_filtered_samples", Help: "Samples of the last successful cycle that are not sent: filtered or over a cap (telemeter-client's name).",
		}),
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "federate_requests_total", Help: "Collection cycles and delivery attempts, by type (telemeter-client's name).",
		}, []string{"type"}),
		failed: f.NewCounterVec(prometheus.CounterOpts{
			Name: "federate_requests_failed_total", Help: "Failed collection cycles and delivery attempts, by type (telemeter-client's name).",
		}, []string{"type"}),
	}
	for _, t := range []string{requestFederate, requestSend} { // exported at 0: the alert divides their rates
		m.requests.WithLabelValues(t)
		m.failed.WithLabelValues(t)
	}
	return m
}

// request counts one collection cycle or delivery attempt and whether it failed.
func (m telemeterClientMetrics) request(typ string, failed bool) {
	m.requests.WithLabelValues(typ).Inc()
	if failed {
		m.failed.WithLabelValues(typ).Inc()
	}
}

// federation records a successful cycle's sizes: read is every sample read
// from /federate, sent those queued for delivery.
func (m telemeterClientMetrics) federation(read, sent int) {
	m.samples.Set(float64(read))
	m.filtered.Set(float64(read - sent))
}
