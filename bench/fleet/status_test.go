package fleet

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/bench"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/receive"
	"github.com/phonehome/phonehome/status"
)

// The status page at fleet scale (issue 18): one tenant of 100k clusters
// × 20 series, as the limiter tracks them.
//
//	go test -tags=dedupelabels -run '^$' -bench 'StatusClusters|StatusTrackingMemory|IngestTracking' -benchtime=1x ./bench/fleet/
//
// bench/results/status.md has the figures.
const (
	statusClusters = 100_000
	statusSeries   = 20
)

// fillTracked admits clusters × series into l as the receiver does: one
// Session per cluster and request, Done at its end.
func fillTracked(l *limits.Limiter, clusters, series int) {
	for c := range clusters {
		id := fmt.Sprintf("%016x", uint64(c)*0x9e3779b97f4a7c15)
		s := l.Session("fleet", id)
		for j := range series {
			_ = s.Admit(fmt.Sprintf("metric_%02d", j), uint64(c)<<20|uint64(j)*0x2545F4914F6CDD1D>>44)
			s.Accept(1)
		}
		s.Done("prometheus.WriteRequest", "phonehome-forwarder/0.1.0")
	}
}

func unlimitedSeriesLimiter(track bool) *limits.Limiter {
	zero := 0
	l := limits.New(nil, limits.Config{Defaults: limits.Spec{MaxSeriesPerCluster: &zero, MaxSeriesPerTenant: &zero, MaxSeriesPerMetric: &zero}}, nil)
	if track {
		l.TrackClusters(receive.Reasons())
	}
	return l
}

// BenchmarkStatusClusters measures the clusters endpoint's latency (p50,
// p99) for the page's three heavy queries.
func BenchmarkStatusClusters(b *testing.B) {
	l := unlimitedSeriesLimiter(true)
	fillTracked(l, statusClusters, statusSeries)
	s := status.New(slog.New(slog.DiscardHandler), nil, status.Options{Limiter: l})
	h := s.Handler()
	id := auth.Identity{Tenant: "fleet", Allow: auth.PermRead}
	for _, q := range []struct{ name, query string }{
		{"page-of-100", "limit=100&offset=50000"},
		{"prefix-search", "q=12&limit=100"},
		{"sort-by-series", "sort=series&order=desc&limit=100"},
		{"sort-by-last-seen", "sort=last_seen&order=desc&limit=100&offset=1000"},
	} {
		b.Run(q.name, func(b *testing.B) {
			var lat []time.Duration
			for b.Loop() {
				for range 100 { // at least 100 requests for a p99
					r := httptest.NewRequest(http.MethodGet, "/api/v1/status/clusters?"+q.query, nil)
					r = r.WithContext(auth.WithIdentity(r.Context(), id))
					rec := httptest.NewRecorder()
					start := time.Now()
					h.ServeHTTP(rec, r)
					lat = append(lat, time.Since(start))
					if rec.Code != http.StatusOK {
						b.Fatalf("%d: %s", rec.Code, rec.Body)
					}
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// BenchmarkStatusTrackingMemory measures the heap the tracking adds per
// cluster: the same 100k × 20 fill with and without TrackClusters.
func BenchmarkStatusTrackingMemory(b *testing.B) {
	heap := func(track bool) (uint64, *limits.Limiter) {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		l := unlimitedSeriesLimiter(track)
		fillTracked(l, statusClusters, statusSeries)
		runtime.GC()
		runtime.ReadMemStats(&after)
		return after.HeapAlloc - before.HeapAlloc, l
	}
	for b.Loop() {
		off, l1 := heap(false)
		on, l2 := heap(true)
		require.Len(b, l2.Clusters("fleet"), statusClusters)
		b.ReportMetric(float64(off)/statusClusters, "B/cluster-untracked")
		b.ReportMetric(float64(on)/statusClusters, "B/cluster-tracked")
		b.ReportMetric((float64(on)-float64(off))/statusClusters, "B/cluster-added")
		runtime.KeepAlive(l1)
		runtime.KeepAlive(l2)
	}
}

// BenchmarkIngestTracking is BenchmarkIngest's steady state (fleet-shaped
// remote-write 1.0 requests of 500 series into the TSDB) with the cluster
// tracking off and on, so the cost of tracking on the write path shows.
func BenchmarkIngestTracking(b *testing.B) {
	for _, track := range []bool{false, true} {
		b.Run(fmt.Sprintf("tracking=%v", track), func(b *testing.B) {
			const (
				clusters = 200
				series   = 500
				stepMs   = 30_000
				rounds   = 8
			)
			f, err := New(templates(b), clusters, series, 1)
			require.NoError(b, err)
			lim := unlimitedRates(nil)
			if track {
				lim.TrackClusters(receive.Reasons())
			}
			_, h := openIngest(b, lim, nil)
			t0 := time.Now().Add(-time.Hour).UnixMilli()
			bodies := make([][][]byte, rounds)
			var fb Batch
			encode := func() {
				for r := range rounds {
					bodies[r] = make([][]byte, clusters)
					for c := range clusters {
						f.Fill(&fb, c, 0, series, r, t0, stepMs)
						bodies[r][c] = encodeV1(b, fb.Series)
					}
				}
			}
			encode()
			for c := range clusters {
				postWrite(b, h, contentTypeV1, bodies[0][c], f.ClusterID(c))
			}
			b.ReportAllocs()
			cpu0 := bench.ProcessCPU()
			n := 0
			for b.Loop() {
				r, c := 1+(n/clusters)%(rounds-1), n%clusters
				if r == 1 && c == 0 && n > 0 {
					b.StopTimer()
					pause := bench.ProcessCPU()
					t0 += rounds * stepMs
					encode()
					cpu0 += bench.ProcessCPU() - pause
					b.StartTimer()
				}
				postWrite(b, h, contentTypeV1, bodies[r][c], f.ClusterID(c))
				n++
			}
			samples := float64(n * series)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/samples, "ns/sample")
			b.ReportMetric(float64((bench.ProcessCPU()-cpu0).Nanoseconds())/samples, "cpu-ns/sample")
			if track {
				cs, ok := lim.Cluster("fleet", f.ClusterID(0))
				require.True(b, ok)
				require.Positive(b, cs.Samples)
			}
		})
	}
}
