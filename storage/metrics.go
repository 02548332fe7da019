package storage

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Rejection reasons, a fixed set so the label stays bounded.
const (
	reasonOutOfOrder = "out_of_order"
	reasonTooOld     = "too_old"
	reasonFuture     = "future"
	reasonDuplicate  = "duplicate"
	reasonInvalid    = "invalid"
	reasonErased     = "erased_cluster"
)

type metrics struct {
	appendedSamples    prometheus.Counter
	appendedHistograms prometheus.Counter
	appendedExemplars  prometheus.Counter
	rejected           *prometheus.CounterVec // by reason
	exemplarsRejected  prometheus.Counter
	tenants            prometheus.Gauge
	uploads            *prometheus.CounterVec // by result
	bucketLag          prometheus.Gauge
	pendingBlocks      prometheus.Gauge
	heldBlocks         prometheus.Gauge
	denied             prometheus.Gauge
	compactionFailures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics { // nil reg: not registered (tests)
	f := promauto.With(reg)
	m := &metrics{
		appendedSamples: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_storage_samples_appended_total", Help: "Float samples committed to the WAL.",
		}),
		appendedHistograms: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_storage_histograms_appended_total", Help: "Native histogram samples committed to the WAL.",
		}),
		appendedExemplars: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_storage_exemplars_appended_total", Help: "Exemplars committed to the WAL.",
		}),
		rejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_storage_samples_rejected_total", Help: "Samples (floats and histograms) refused by reason.",
		}, []string{"reason"}),
		exemplarsRejected: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_storage_exemplars_rejected_total", Help: "Exemplars refused by the TSDB (the samples were still stored).",
		}),
		compactionFailures: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_storage_head_compactions_failed_total",
			Help: "Failed attempts to cut a tenant's head into blocks (retried after 1s, doubling up to 1m); TSDB's prometheus_tsdb_compactions_total counts the blocks written.",
		}),
		tenants: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_storage_tenants", Help: "Tenants with an open TSDB.",
		}),
		uploads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_storage_block_uploads_total", Help: "Block uploads to the bucket by result.",
		}, []string{"result"}),
		bucketLag: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_storage_bucket_lag_seconds", Help: "Seconds between now and the max time of the oldest block not yet uploaded; 0 when none.",
		}),
		pendingBlocks: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_storage_blocks_pending_upload", Help: "Local blocks not yet uploaded.",
		}),
		heldBlocks: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_storage_blocks_held_by_erasure",
			Help: "Local blocks not uploaded because an erasure of their tenant has not finished erasing the local storage (also in phonehome_storage_blocks_pending_upload).",
		}),
		denied: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_storage_denied_clusters", Help: "Erased clusters whose writes are refused until re-admitted.",
		}),
	}
	for _, r := range []string{reasonOutOfOrder, reasonTooOld, reasonFuture, reasonDuplicate, reasonInvalid, reasonErased} {
		m.rejected.WithLabelValues(r)
	}
	for _, r := range []string{"success", "failure"} {
		m.uploads.WithLabelValues(r)
	}
	return m
}
