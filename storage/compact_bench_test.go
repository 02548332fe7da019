package storage_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/gcburst"
	"github.com/phonehome/phonehome/storage"
)

var compactionSeries = flag.Int("compaction-series", 200_000, "head series for BenchmarkHeadCompactionPeak (issue 19's sizes: 200000, 1000000)")

// BenchmarkHeadCompactionPeak measures how far the heap grows over the live
// heap while the head is cut into blocks (here the flush at shutdown, which
// runs the same CompactHead as the cut every block range), at the receiver's
// GOGC=70 with and without the compaction's GC burst (package gcburst).
// Telemetry shape: 10 samples per series 4m30s apart, 500 series per
// cluster. One iteration is one compaction:
//
//	go test -run '^$' -bench HeadCompactionPeak -benchtime=1x ./storage -args -compaction-series=1000000
func BenchmarkHeadCompactionPeak(b *testing.B) {
	for _, bc := range []struct {
		name  string
		burst int
	}{{"gogc=70", 0}, {fmt.Sprintf("gogc=70,compaction-gogc=%d", gcburst.DefaultPercent), gcburst.DefaultPercent}} {
		b.Run(bc.name, func(b *testing.B) {
			defer debug.SetGCPercent(debug.SetGCPercent(70))
			gcburst.SetPercent(bc.burst)
			defer gcburst.SetPercent(gcburst.DefaultPercent)
			var peakOver, took float64
			for b.Loop() {
				b.StopTimer()
				db := fillHead(b, *compactionSeries)
				runtime.GC()
				live := heapObjects()
				stop := samplePeak()
				b.StartTimer()
				start := time.Now()
				require.NoError(b, db.Close()) // flushes the head
				took += time.Since(start).Seconds()
				peakOver += float64(stop() - live)
			}
			n := float64(b.N)
			b.ReportMetric(peakOver/n/float64(*compactionSeries), "peak-heap-over-live-B/series")
			b.ReportMetric(took/n, "compaction-s")
		})
	}
}

// fillHead opens a DB that flushes but does not upload at shutdown, and
// writes series × 10 samples into one tenant's head.
func fillHead(b *testing.B, series int) *storage.DB {
	no := false
	db, err := storage.OpenWithBucket(discard, nil, b.TempDir(), storage.Config{UploadOnShutdown: &no}, objstore.NewInMemBucket(), time.Now)
	require.NoError(b, err)
	const perCluster, batch = 500, 5000
	start := time.Now().Add(-time.Hour).UnixMilli()
	req := make([]prompb.TimeSeries, 0, batch)
	for round := range 10 {
		ts := start + int64(round)*(270*time.Second).Milliseconds()
		for i := 0; i < series; i += batch {
			req = req[:0]
			for j := i; j < min(i+batch, series); j++ {
				req = append(req, prompb.TimeSeries{
					Labels: []prompb.Label{
						{Name: "__name__", Value: fmt.Sprintf("csv_succeeded_%d", j%7)},
						{Name: "_id", Value: fmt.Sprintf("cluster-%06d", j/perCluster)},
						{Name: "name", Value: fmt.Sprintf("operator-%03d", j%perCluster)},
						{Name: "namespace", Value: fmt.Sprintf("ns-%02d", j%37)},
						{Name: "version", Value: fmt.Sprintf("v4.%d", j%13)},
					},
					Samples: []prompb.Sample{{Timestamp: ts, Value: float64(j)}},
				})
			}
			_, err := db.Write(context.Background(), "bench", req)
			require.NoError(b, err)
		}
	}
	return db
}

func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// samplePeak reads the heap every millisecond until the returned function
// is called, which returns the largest reading.
func samplePeak() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			peak.Store(max(peak.Load(), heapObjects()))
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-finished
		return max(peak.Load(), heapObjects())
	}
}
