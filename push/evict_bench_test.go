package push

import (
	"fmt"
	"log/slog"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
)

// noSyncFile is the log's file without fsyncs: BenchmarkPushEvict measures
// the work done under the Gateway's mutex, not the disk.
type noSyncFile struct{ logFileIO }

func (noSyncFile) Sync() error { return nil }

// BenchmarkPushEvict pushes one new series at a time into a tenant whose
// series budget is full of flushed series pushed once, so that every push
// evicts one (the junk-flood case of the README's "Series budget"). A flush
// is simulated every flushEvery pushes (a 30s flush interval at ~330
// pushes/s), which makes the series pushed since evictable.
func BenchmarkPushEvict(b *testing.B) {
	const flushEvery = 10_000
	for _, budget := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("budget=%d", budget), func(b *testing.B) {
			cfg := testConfig()
			cfg.MaxSeriesPerTenant = budget
			g, err := Open(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), b.TempDir(), &fakeWriter{}, cfg, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			g.log.f = noSyncFile{g.log.f}
			sb := labels.NewScratchBuilderWithSymbolTable(labels.NewSymbolTable(), 3)
			series := func(i int) delta {
				sb.Reset()
				sb.Add("__name__", "installs_total")
				sb.Add("job", "i")
				sb.Add("junk", strconv.Itoa(i))
				return delta{Labels: sb.Labels(), Value: 1}
			}
			types := map[string]string{"installs_total": "counter"}
			for i := 0; i < budget; i += 1000 { // fill the budget
				rec := &record{Tenant: "bench", Types: types}
				for j := i; j < i+1000 && j < budget; j++ {
					rec.Samples = append(rec.Samples, series(j))
				}
				if err := g.accept(rec); err != nil {
					b.Fatal(err)
				}
			}
			flushed := func() {
				g.mu.Lock()
				g.state["bench"].flushed(g.seq)
				g.mu.Unlock()
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

// BenchmarkEvictOrderBuild is the once-per-flush part of BenchmarkPushEvict:
// building a tenant's eviction order, under the Gateway's mutex, at the
// first push after a flush that needs room.
func BenchmarkEvictOrderBuild(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("series=%d", n), func(b *testing.B) {
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
			b.ReportAllocs()
			for b.Loop() {
				ts.evict = nil
				ts.evictOrder()
			}
		})
	}
}
