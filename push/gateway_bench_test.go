package push

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/phonehome/phonehome/auth"
)

// BenchmarkPush measures accepted pushes per second and their p99 latency
// (each push is one installer run: one counter series, fsynced before the
// answer) over distinct label sets, from parallel clients. The state
// is pre-filled with the label sets, so every push adds to an existing series.
func BenchmarkPush(b *testing.B) {
	for _, sets := range []int{10000} {
		b.Run(fmt.Sprintf("labelsets=%d", sets), func(b *testing.B) {
			cfg := testConfig()
			cfg.MaxSeriesPerTenant = sets
			cfg.RateLimit = RateLimit{RequestsPerSecond: 1e9, Burst: 1 << 30}
			gw, err := Open(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), b.TempDir(), &fakeWriter{}, cfg, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer gw.Close()
			h := auth.Middleware(auth.Insecure{Tenant: "bench"}, auth.PermWrite, nil, gw)
			bodies := make([]string, sets)
			for i := range bodies {
				bodies[i] = fmt.Sprintf("# TYPE cluster_installation_invocation counter\ncluster_installation_invocation{platform=\"p%d\",version=\"4.%d\",result=\"success\"} 1\n", i%37, i)
			}
			push := func(i int) time.Duration {
				req := httptest.NewRequest(http.MethodPost, "/metrics/job/installer", strings.NewReader(bodies[i%sets]))
				rec := httptest.NewRecorder()
				start := time.Now()
				h.ServeHTTP(rec, req)
				d := time.Since(start)
				if rec.Code != http.StatusOK {
					panic(rec.Body.String())
				}
				return d
			}
			for i := range sets {
				push(i)
			}
			var (
				mu   sync.Mutex
				lats []time.Duration
				next int64
			)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.SetParallelism(16) // 32 pushers on 2 cores: many installers at once, so fsyncs can be shared
			b.RunParallel(func(pb *testing.PB) {
				var local []time.Duration
				for pb.Next() {
					mu.Lock()
					i := int(next)
					next++
					mu.Unlock()
					local = append(local, push(i))
				}
				mu.Lock()
				lats = append(lats, local...)
				mu.Unlock()
			})
			elapsed := time.Since(start)
			b.StopTimer()
			slices.Sort(lats)
			b.ReportMetric(float64(len(lats))/elapsed.Seconds(), "pushes/s")
			b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-µs")
		})
	}
}
