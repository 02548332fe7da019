package limits

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// splitmix64 spreads i over the hash space like labels.Labels.Hash would.
func splitmix64(i uint64) uint64 {
	z := i + 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func unlimited() Config {
	return Config{Defaults: unlimitedSeries()}
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// BenchmarkAdmitExisting is the hot path: a known series is written again.
func BenchmarkAdmitExisting(b *testing.B) {
	const n = 100_000
	metrics := names("metric_", 500)
	l := New(nil, unlimited(), nil)
	s := l.Session("t", "c")
	for i := range n {
		if err := s.Admit(metrics[i%len(metrics)], splitmix64(uint64(i))); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("session", func(b *testing.B) {
		b.ReportAllocs()
		s := l.Session("t", "c")
		i := 0
		for b.Loop() {
			if err := s.Admit(metrics[i%len(metrics)], splitmix64(uint64(i%n))); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "series/s")
	})
	b.Run("one-off", func(b *testing.B) { // a Session per series: clock and config read per call
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := admitSeries(l, "t", "c", metrics[i%len(metrics)], splitmix64(uint64(i%n))); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			s := l.Session("t", "c")
			i := 0
			for pb.Next() {
				if err := s.Admit(metrics[i%len(metrics)], splitmix64(uint64(i%n))); err != nil {
					b.Error(err)
					return
				}
				i += 7
			}
		})
	})
}

// BenchmarkAdmitNew admits a series never seen before on every iteration.
func BenchmarkAdmitNew(b *testing.B) {
	metrics := names("metric_", 500)
	clusters := names("cluster-", 1000)
	b.ReportAllocs()
	l := New(nil, Config{Defaults: Spec{
		MaxSeriesPerCluster: ptr(0), MaxSeriesPerTenant: ptr(0), MaxSeriesPerMetric: ptr(1 << 40),
	}}, nil)
	i := 0
	var s Session
	for b.Loop() {
		if i%1000 == 0 { // a request: 1000 series of one cluster
			s = l.Session("t", clusters[(i/1000)%len(clusters)])
		}
		if err := s.Admit(metrics[i%len(metrics)], splitmix64(uint64(i))); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "series/s")
}

// BenchmarkAdmitRejected: a noisy cluster keeps sending new series over its limit.
func BenchmarkAdmitRejected(b *testing.B) {
	l := New(nil, Config{Defaults: Spec{MaxSeriesPerCluster: ptr(10)}}, nil)
	s := l.Session("t", "c")
	for i := range 10 {
		_ = s.Admit("m", splitmix64(uint64(i)))
	}
	b.ReportAllocs()
	i := 10
	for b.Loop() {
		if s.Admit("m", splitmix64(uint64(i))) == nil {
			b.Fatal("admitted over the limit")
		}
		i++
	}
}

func BenchmarkAllowSamples(b *testing.B) {
	const perRequest = 2000
	clk := newClock()
	l := New(nil, Config{}, clk.Now)
	clusters := names("cluster-", 1000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		clk.Advance(time.Second) // keep the buckets from running dry
		if _, err := l.AllowSamples("t", clusters[i%len(clusters)], perRequest); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i*perRequest), "ns/sample")
}

// BenchmarkMemoryPerSeries fills one tenant with n series (1000 per cluster,
// 500 metric names) and reports the heap growth per tracked series, the cost
// of admitting each new series, and of re-admitting each once tracked (the
// hot path with the tables far larger than the CPU caches).
// Run it once, with -benchtime=1x (see BENCHMARKS.md).
func BenchmarkMemoryPerSeries(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("series=%dM", n/1_000_000), func(b *testing.B) {
			metrics := names("metric_", 500)
			clusters := names("cluster-", n/1000)
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)

				l := New(nil, unlimited(), nil)
				start := time.Now()
				for c := range clusters {
					s := l.Session("t", clusters[c])
					for j := range 1000 {
						i := c*1000 + j
						if err := s.Admit(metrics[i%len(metrics)], splitmix64(uint64(i))); err != nil {
							b.Fatal(err)
						}
					}
				}
				admitNew := time.Since(start)

				runtime.GC()
				runtime.ReadMemStats(&after)

				start = time.Now()
				for c := range clusters {
					s := l.Session("t", clusters[c])
					for j := range 1000 {
						i := c*1000 + j
						if err := s.Admit(metrics[i%len(metrics)], splitmix64(uint64(i))); err != nil {
							b.Fatal(err)
						}
					}
				}
				admitExisting := time.Since(start)
				if got := l.tracked.Load(); got != int64(n) {
					b.Fatalf("tracked %d, want %d", got, n)
				}
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "B/series")
				b.ReportMetric(float64(admitNew.Nanoseconds())/float64(n), "ns/new-series")
				b.ReportMetric(float64(admitExisting.Nanoseconds())/float64(n), "ns/existing-series")
				runtime.KeepAlive(l)
			}
		})
	}
}
