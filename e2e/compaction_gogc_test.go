package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// --runtime.compaction-gogc on the binary: by default a head cut decides on
// a GC burst (lowered, or skipped_busy if the heap was busy) and GOGC is back
// at --runtime.gogc's 70 afterwards; at 0 no cut touches GOGC at all.
func TestCompactionGOGCFlag(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		decisions func(t *testing.T, n float64)
	}{
		{"default", nil, func(t *testing.T, n float64) { require.GreaterOrEqual(t, n, 1.0, "the cut made no burst decision") }},
		{"off", []string{"--runtime.compaction-gogc=0"}, func(t *testing.T, n float64) { require.Zero(t, n, "a cut touched GOGC with the flag at 0") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			r := startReceiver(t, writeReceiverConfig(t, dir, "", ""), filepath.Join(dir, "data"), tc.args...)
			now := time.Now()
			for _, at := range []time.Time{now.Add(-5 * time.Hour), now.Add(-105 * time.Minute)} { // 3h15m: compactable
				mustWrite(t, r.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
					Labels: labelsOf("__name__", "gogc_samples", "_id", "c1"), Samples: []prompb.Sample{{Timestamp: at.UnixMilli(), Value: 1}},
				}}})
			}
			eventually(t, 90*time.Second, func() error {
				if n := metricValue(scrapeMetrics(t, r.URL()), "prometheus_tsdb_compactions_total", map[string]string{"tenant": "acme"}); n < 1 {
					return fmt.Errorf("no head block cut yet (%v)", n)
				}
				return nil
			})
			mfs := scrapeMetrics(t, r.URL())
			lowered := metricValue(mfs, "phonehome_gc_bursts_total", map[string]string{"outcome": "lowered"})
			skipped := metricValue(mfs, "phonehome_gc_bursts_total", map[string]string{"outcome": "skipped_busy"})
			unchanged := metricValue(mfs, "phonehome_gc_bursts_total", map[string]string{"outcome": "unchanged"})
			require.GreaterOrEqual(t, lowered, 0.0, "phonehome_gc_bursts_total{outcome=\"lowered\"} not exported")
			require.GreaterOrEqual(t, skipped, 0.0, "phonehome_gc_bursts_total{outcome=\"skipped_busy\"} not exported")
			require.Equal(t, 0.0, unchanged, "GOGC 70 is above the burst's 10: no burst can leave it unchanged")
			tc.decisions(t, lowered+skipped)
			require.Equal(t, 0.0, metricValue(mfs, "phonehome_gc_burst_running", nil))
			require.Equal(t, 70.0, metricValue(mfs, "go_gc_gogc_percent", nil), "GOGC not restored to --runtime.gogc")
		})
	}
}
