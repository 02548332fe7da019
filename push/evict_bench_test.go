package push

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/storage"
)

// noSyncFile is the log's file without fsyncs: BenchmarkPushEvict measures
// the work done under the Gateway's mutex, not the disk.
type noSyncFile struct{ logFileIO }

func (noSyncFile) Sync() error { return nil }

// withoutFsyncs makes the log's file skip fsyncs, and the files it opens
// later too (a flush replaces the file when pushes ran during it).
func withoutFsyncs(g *Gateway) {
	g.log.f = noSyncFile{g.log.f}
	g.log.open = func(path string, flag int) (logFileIO, error) {
		f, err := openLogFile(path, flag)
		if err != nil {
			return nil, err
		}
		return noSyncFile{f}, nil
	}
}

// BenchmarkPushEvict pushes one new series at a time into a tenant whose
// series budget is full of flushed series pushed once, so that every push
// evicts one (the junk-flood case of the README's "Series budget"). A flush
// is simulated every flushEvery pushes (a 30s flush interval at ~330
// pushes/s), which makes the series pushed since evictable.
func BenchmarkPushEvict(b *testing.B) {
	const flushEvery = 10_000
	for _, budget := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("budget=%d", budget), func(b *testing.B) {
			g, series, types := fullBudget(b, budget, budget, &fakeWriter{})
			flushed := func() { // as Flush does, without its write
				g.mu.Lock()
				st := g.state["bench"]
				c, seq := evictCopy{ts: st, cands: st.evictCandidates()}, g.seq
				g.mu.Unlock()
				g.flushed(seq, c)
			}
			flushed()
			next := budget
			b.ReportAllocs()
			for b.Loop() {
				if err := g.accept(&record{Tenant: "bench", Types: types, Samples: []delta{series(next)}}); err != nil {
					b.Fatal(err)
				}
				if next++; next%flushEvery == 0 {
					flushed()
				}
			}
		})
	}
}

// fullBudget opens a Gateway whose tenant "bench" has a budget of budget
// series and holds n of them, pushed once each, and returns the series
// maker: series(i) is the i-th (not goroutine-safe).
func fullBudget(b *testing.B, budget, n int, w storage.Writer) (*Gateway, func(i int) delta, map[string]string) {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = budget
	g, err := Open(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), b.TempDir(), w, cfg, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Close() })
	withoutFsyncs(g)
	sb := labels.NewScratchBuilderWithSymbolTable(labels.NewSymbolTable(), 3)
	series := func(i int) delta {
		sb.Reset()
		sb.Add("__name__", "installs_total")
		sb.Add("job", "i")
		sb.Add("junk", strconv.Itoa(i))
		return delta{Labels: sb.Labels(), Value: 1}
	}
	types := map[string]string{"installs_total": "counter"}
	for i := 0; i < n; i += 1000 {
		rec := &record{Tenant: "bench", Types: types}
		for j := i; j < i+1000 && j < n; j++ {
			rec.Samples = append(rec.Samples, series(j))
		}
		if err := g.accept(rec); err != nil {
			b.Fatal(err)
		}
	}
	return g, series, types
}

// discardWriter stores nothing: the flushes of BenchmarkFirstEvictionAfterFlush
// cost the Gateway's work, not a fake TSDB's.
type discardWriter struct{}

func (discardWriter) Write(_ context.Context, _ string, series []prompb.TimeSeries) (storage.Stats, error) {
	return storage.Stats{Samples: len(series)}, nil
}

// BenchmarkFirstEvictionAfterFlush is a flush, then the first push that
// needs room, into a tenant whose budget is full of flushed series pushed
// once, while another client pushes to a series the tenant holds (its
// pushes wait while the Gateway's mutex is held): evict-push-µs is the
// evicting push's latency, probe-max-µs the worst latency of the other
// client's pushes meanwhile, flush-probe-max-µs during the flush; medians
// over the iterations. An iteration includes the flush (ns/op): run with
// -benchtime=10x or more.
func BenchmarkFirstEvictionAfterFlush(b *testing.B) {
	for _, budget := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("budget=%d", budget), func(b *testing.B) {
			g, series, types := fullBudget(b, budget, budget-1, discardWriter{})
			probe := func() error { // a series pushed more than once: never evicted here
				return g.accept(&record{Tenant: "bench", Types: types, Samples: []delta{{Labels: labels.FromStrings("__name__", "installs_total", "job", "probe"), Value: 1}}})
			}
			for range 2 {
				if err := probe(); err != nil {
					b.Fatal(err)
				}
			}
			ctx := context.Background()
			next := budget
			var evictPush, probeMax, flushProbeMax []time.Duration
			for b.Loop() {
				worst, err := whileProbing(probe, func() error {
					g.Flush(ctx)
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				flushProbeMax = append(flushProbeMax, worst)
				worst, err = whileProbing(probe, func() error {
					start := time.Now()
					err := g.accept(&record{Tenant: "bench", Types: types, Samples: []delta{series(next)}})
					evictPush = append(evictPush, time.Since(start))
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				probeMax = append(probeMax, worst)
				next++
			}
			b.ReportMetric(medianMicros(evictPush), "evict-push-µs")
			b.ReportMetric(medianMicros(probeMax), "probe-max-µs")
			b.ReportMetric(medianMicros(flushProbeMax), "flush-probe-max-µs")
		})
	}
}

// whileProbing runs fn while probe runs again and again in another
// goroutine (from before fn starts until it has returned), and returns the
// worst latency of probe.
func whileProbing(probe, fn func() error) (time.Duration, error) {
	started, stop := make(chan struct{}), make(chan struct{})
	type result struct {
		worst time.Duration
		err   error
	}
	done := make(chan result)
	go func() {
		var r result
		for i := 0; ; i++ {
			start := time.Now()
			if r.err = probe(); r.err != nil {
				if i == 0 {
					close(started)
				}
				done <- r
				return
			}
			r.worst = max(r.worst, time.Since(start))
			if i == 0 {
				close(started)
			}
			select {
			case <-stop:
				done <- r
				return
			default:
			}
		}
	}()
	<-started
	err := fn()
	close(stop)
	r := <-done
	return r.worst, errors.Join(err, r.err)
}

func medianMicros(ds []time.Duration) float64 {
	slices.Sort(ds)
	return float64(ds[len(ds)/2].Microseconds())
}

// BenchmarkEvictOrderBuild is the once-per-flush part of BenchmarkPushEvict:
// building a tenant's eviction order (by the flush, outside the Gateway's
// mutex; under it by a push that finds none).
func BenchmarkEvictOrderBuild(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("series=%d", n), func(b *testing.B) {
			ts := benchTenant(n)
			b.ReportAllocs()
			for b.Loop() {
				ts.evict = nil
				ts.evictOrder()
			}
		})
	}
}

// BenchmarkEvictCandidates is the copy of what the eviction order needs of
// each series, on its own (a flush takes it from its copy of the state
// without the Gateway's mutex, a push that finds no order with it).
func BenchmarkEvictCandidates(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("series=%d", n), func(b *testing.B) {
			ts := benchTenant(n)
			b.ReportAllocs()
			for b.Loop() {
				ts.evictCandidates()
			}
		})
	}
}

// benchTenant holds n flushed counter series, every other one pushed once.
func benchTenant(n int) *tenantState {
	ts := newTenantState()
	sb := labels.NewScratchBuilderWithSymbolTable(labels.NewSymbolTable(), 3)
	for i := range n {
		sb.Reset()
		sb.Add("__name__", "installs_total")
		sb.Add("job", "i")
		sb.Add("junk", strconv.Itoa(i))
		it := &aggItem{Labels: sb.Labels(), Value: 1, Touched: int64(i), Pushes: 1 + int64(i%2), seq: uint64(i + 1)}
		ts.Series[seriesKey(it.Labels)] = it
	}
	ts.flushedSeq = uint64(n)
	return ts
}
