package receive

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	requests        *prometheus.CounterVec // by HTTP code
	requestsByProto *prometheus.CounterVec // decoded requests by protobuf message
	duration        prometheus.Histogram
	bytes           *prometheus.CounterVec // by encoding
	samples         *prometheus.CounterVec // by result
	rejected        *prometheus.CounterVec // by reason
	histograms      prometheus.Counter
	exemplars       prometheus.Counter
	seriesAccepted  prometheus.Counter
	unsortedSeries  prometheus.Counter
	unauthenticated prometheus.Counter
	inflight        prometheus.GaugeFunc   // of Handler.inflight, registered by NewHandler
	overloaded      *prometheus.CounterVec // by limit
	// Telemeter's paths (telemeter.go)
	replicaDropped   prometheus.Counter
	replicaFailovers prometheus.Counter
	restamped        *prometheus.CounterVec // by tense
}

// newMetrics registers the handler's metrics; a nil reg registers nothing.
func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_receive_requests_total",
			Help: "Write requests by endpoint (handler: /api/v1/write, /metrics/v1/receive, /upload) and HTTP status code.",
		}, []string{"handler", "code"}),
		requestsByProto: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_receive_decoded_requests_total",
			Help: "Remote-write requests decoded, by protobuf message (remote-write version).",
		}, []string{"proto"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name:                        "phonehome_receive_request_duration_seconds",
			Help:                        "Time to handle a remote-write request, WAL commit included.",
			Buckets:                     prometheus.ExponentialBuckets(0.001, 4, 8),
			NativeHistogramBucketFactor: 1.1,
		}),
		bytes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_receive_bytes_total",
			Help: "Remote-write body bytes received, as sent (snappy) and decoded.",
		}, []string{"encoding"}),
		samples: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_receive_samples_total",
			Help: "Float samples received, by outcome.",
		}, []string{"result"}),
		rejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_receive_rejected_samples_total",
			Help: "Samples and histograms refused, by reason.",
		}, []string{"reason"}),
		histograms: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_receive_histograms_accepted_total",
			Help: "Native histogram samples written to the WAL.",
		}),
		exemplars: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_receive_exemplars_accepted_total",
			Help: "Exemplars written.",
		}),
		seriesAccepted: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_receive_series_total",
			Help: "Series that passed validation, counted once per request they appear in.",
		}),
		unsortedSeries: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_receive_unsorted_series_total",
			Help: "Series that passed validation after their labels, sent out of order by name, were sorted (as Prometheus does), counted once per request they appear in.",
		}),
		unauthenticated: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_receive_unauthenticated_requests_total",
			Help: "Write requests refused by authentication: a missing or invalid credential (401), one without the write permission (403), or an authorizer that could not answer (503); phonehome_receive_requests_total{code} tells them apart.",
		}),
		overloaded: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_receive_overloaded_requests_total",
			Help: "Write requests refused (503, Retry-After) because the receiver was serving --receive.max-inflight-requests (limit=\"requests\", before the body is read) or the requests in flight held --receive.max-inflight-bytes (limit=\"bytes\").",
		}, []string{"limit"}),
		replicaDropped: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_receive_telemeter_replica_dropped_samples_total",
			Help: "Samples on Telemeter's remote-write path from a Prometheus replica other than the one elected for its cluster: answered as written, not stored (the elected replica's copy is).",
		}),
		replicaFailovers: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_receive_telemeter_replica_failovers_total",
			Help: "Clusters whose elected Prometheus replica was silent for the failover timeout and was replaced by another.",
		}),
		restamped: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_receive_upload_restamped_total",
			Help: "Upload metrics stored at the receive time instead of their own timestamp, as telemeter-server does, by how far off their timestamp was: past or future (more than 5m), or present.",
		}, []string{"tense"}),
	}
	for _, tense := range []string{"past", "present", "future"} {
		m.restamped.WithLabelValues(tense)
	}
	for _, r := range []string{"accepted", "rejected"} {
		m.samples.WithLabelValues(r)
	}
	for _, r := range allReasons {
		m.rejected.WithLabelValues(r)
	}
	for _, p := range []string{protoV1, protoV2} {
		m.requestsByProto.WithLabelValues(p)
	}
	for _, e := range []string{"snappy", "decoded"} {
		m.bytes.WithLabelValues(e)
	}
	return m
}

// countRestamped counts the timestamps an upload's restamp replaced.
func (h *Handler) countRestamped(d *familyRequest) {
	for tense, name := range [numTenses]string{tensePast: "past", tensePresent: "present", tenseFuture: "future"} {
		if n := d.drift[tense]; n > 0 {
			h.metrics.restamped.WithLabelValues(name).Add(float64(n))
		}
	}
}

// path is the route's endpoint: the requests metric's handler label.
func (r route) path() string {
	switch r {
	case routeUpload:
		return "/upload"
	case routeTelemeterWrite:
		return "/metrics/v1/receive"
	}
	return "/api/v1/write"
}

// routeOf is the route serving path (auth.Middleware's refusals know the
// request only); the write routes are the only paths it is called for.
func routeOf(path string) route {
	for _, rt := range []route{routeUpload, routeTelemeterWrite} {
		if path == rt.path() {
			return rt
		}
	}
	return routeRemoteWrite
}
