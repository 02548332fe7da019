package push

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

type metrics struct {
	requests       *prometheus.CounterVec // by HTTP code
	rejected       *prometheus.CounterVec // by reason
	acceptedPushes prometheus.Counter
	acceptedSample prometheus.Counter
	flushes        *prometheus.CounterVec // by result
	flushedSamples prometheus.Counter
	compactions    *prometheus.CounterVec // by result
	expiredSeries  prometheus.Counter
	logFailures    prometheus.Counter     // fsyncs or writes that left the log in doubt
	recoveries     *prometheus.CounterVec // rewrites of the log after one, by result
	logUnusable    prometheus.Gauge
	evicted        *prometheus.CounterVec // by tenant
	budgetRefused  *prometheus.CounterVec // by tenant
}

// seriesCollector exports the series each tenant holds. Tenants are the
// configured ones (a bounded set), as in phonehome_gathering_*.
type seriesCollector struct {
	desc   *prometheus.Desc
	series func() map[string]int
}

func (c seriesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c seriesCollector) Collect(ch chan<- prometheus.Metric) {
	for tenant, n := range c.series() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), tenant)
	}
}

func newMetrics(reg prometheus.Registerer, series func() map[string]int) *metrics { // nil reg: not registered (tests)
	f := promauto.With(reg)
	m := &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_push_requests_total", Help: "Push requests by HTTP status code.",
		}, []string{"code"}),
		rejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_push_rejected_total", Help: "Rejected pushes by reason.",
		}, []string{"reason"}),
		acceptedPushes: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_push_accepted_pushes_total", Help: "Pushes accepted into the aggregated state.",
		}),
		acceptedSample: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_push_accepted_samples_total", Help: "Samples (histogram buckets count one each) of accepted pushes.",
		}),
		flushes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_push_flushes_total", Help: "Writes of the aggregated state into the tenants' TSDBs, by result.",
		}, []string{"result"}),
		flushedSamples: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_push_flushed_samples_total", Help: "Samples of the aggregated state written into the TSDBs.",
		}),
		compactions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_push_compactions_total", Help: "Compactions of the push log into a snapshot, by result.",
		}, []string{"result"}),
		expiredSeries: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_push_expired_series_total", Help: "Aggregated push series dropped because no push touched them for push.series_ttl.",
		}),
		logFailures: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_push_log_failures_total",
			Help: "Failed fsyncs (or writes that could not be undone) of the push log; the pushes not yet durable were refused and not counted.",
		}),
		recoveries: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_push_log_recoveries_total",
			Help: "Rewrites of the push log from the acknowledged state after a failure, by result; pushes get 503 until one succeeds.",
		}, []string{"result"}),
		logUnusable: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_push_log_unusable",
			Help: "1 while the push log failed and could not be rewritten yet (pushes get 503), else 0.",
		}),
		evicted: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_push_evicted_series_total",
			Help: "Aggregated push series evicted, by tenant, to make room for new ones when push.max_series_per_tenant was reached (their last value is in the TSDB).",
		}, []string{"tenant"}),
		budgetRefused: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_push_series_limit_refusals_total",
			Help: "Pushes refused, by tenant, because push.max_series_per_tenant was reached and no series could be evicted (also in phonehome_push_rejected_total{reason=\"series_limit\"}).",
		}, []string{"tenant"}),
	}
	if reg != nil {
		reg.MustRegister(seriesCollector{
			desc:   prometheus.NewDesc("phonehome_push_series", "Aggregated push series held, by tenant (at most push.max_series_per_tenant each).", []string{"tenant"}, nil),
			series: series,
		})
	}
	for _, r := range allReasons {
		m.rejected.WithLabelValues(r)
	}
	for _, r := range []string{"success", "failure"} {
		m.flushes.WithLabelValues(r)
		m.compactions.WithLabelValues(r)
		m.recoveries.WithLabelValues(r)
	}
	return m
}
