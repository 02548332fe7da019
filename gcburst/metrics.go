package gcburst

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Counts for the metrics: bursts that lowered GOGC, found it as low already,
// or were skipped (BeginIfQuiet on a busy heap).
var loweredBursts, unchangedBursts, skippedBusy atomic.Uint64

// RegisterMetrics registers the bursts' metrics with reg: whether a block
// write ran at the burst's GOGC is otherwise visible only as GC activity.
func RegisterMetrics(reg prometheus.Registerer) {
	f := promauto.With(reg)
	const help = "Block writes (head cuts and flushes, rewrites, bucket compactions) by what they did to GOGC: lowered to --runtime.compaction-gogc, unchanged (--runtime.gogc is as low), or skipped_busy (the heap was not quiet: a catch-up)."
	outcomes := map[string]*atomic.Uint64{"lowered": &loweredBursts, "unchanged": &unchangedBursts, "skipped_busy": &skippedBusy}
	for outcome, n := range outcomes {
		f.NewCounterFunc(prometheus.CounterOpts{
			Name: "phonehome_gc_bursts_total", Help: help,
			ConstLabels: prometheus.Labels{"outcome": outcome},
		}, func() float64 { return float64(n.Load()) })
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "phonehome_gc_burst_running",
		Help: "1 while GOGC is lowered to --runtime.compaction-gogc for a block write.",
	}, func() float64 {
		mu.Lock()
		defer mu.Unlock()
		if active > 0 {
			return 1
		}
		return 0
	})
}
