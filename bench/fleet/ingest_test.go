package fleet

import (
	"bytes"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/bench"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/receive"
	"github.com/phonehome/phonehome/storage"
)

// BenchmarkIngest measures the receiver's whole write path in one process,
// without HTTP transport: snappy, decode, validation, limits, and the TSDB
// append and WAL commit, for fleet-shaped remote-write 1.0 requests (one
// cluster's 500 series per request, as the forwarder sends them). The first
// round creates the series outside the timer; every measured request appends
// one point to existing series, the steady state of a fleet. It is the
// in-process counterpart of `make bench-fleet SCENARIO=steady`, for
// profiling: go test -run '^$' -bench Ingest -cpuprofile cpu.out ./bench/fleet/
func BenchmarkIngest(b *testing.B) {
	b.Run("policy=none", func(b *testing.B) { benchmarkIngest(b, nil) })
	// The server-side allowlist a fleet runs with: every series is matched.
	sel, err := allowlist.ReadSelectors(bytes.NewReader(bench.TelemetryAllowlist))
	require.NoError(b, err)
	pol, err := receive.NewPolicy(&receive.Config{Allowlist: append(sel, `{__name__=~".+",shard!=""}`)})
	require.NoError(b, err)
	b.Run("policy=telemetry-allowlist", func(b *testing.B) { benchmarkIngest(b, pol) })
}

func benchmarkIngest(b *testing.B, pol *receive.Policy) {
	const (
		clusters = 200
		series   = 500
		stepMs   = 30_000
	)
	f, err := New(templates(b), clusters, series, 1)
	require.NoError(b, err)
	_, h := openIngest(b, unlimitedRates(nil), pol)

	// Rounds of bodies, encoded up front so the encoding is not measured.
	const rounds = 8
	t0 := time.Now().Add(-time.Hour).UnixMilli()
	bodies := make([][][]byte, rounds)
	var fb Batch
	for r := range rounds {
		bodies[r] = make([][]byte, clusters)
		for c := range clusters {
			f.Fill(&fb, c, 0, series, r, t0, stepMs)
			bodies[r][c] = encodeV1(b, fb.Series)
		}
	}
	send := func(body []byte, c int) { postWrite(b, h, contentTypeV1, body, f.ClusterID(c)) }
	for c := range clusters {
		send(bodies[0][c], c) // creates the series
	}
	b.ReportAllocs()
	cpu0 := bench.ProcessCPU()
	n := 0
	for b.Loop() {
		r, c := 1+(n/clusters)%(rounds-1), n%clusters
		if r == 1 && c == 0 && n > 0 {
			// Out of fresh points: move to a new time range by shifting
			// rounds, which the TSDB accepts as in-order appends.
			b.StopTimer()
			pause := bench.ProcessCPU()
			t0 += rounds * stepMs
			for r := range rounds {
				for c := range clusters {
					f.Fill(&fb, c, 0, series, r, t0, stepMs)
					bodies[r][c] = encodeV1(b, fb.Series)
				}
			}
			cpu0 += bench.ProcessCPU() - pause
			b.StartTimer()
		}
		send(bodies[r][c], c)
		n++
	}
	samples := float64(n * series)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/samples, "ns/sample")
	// CPU of the whole process (GC included, the re-encoding excluded):
	// steadier than wall time on a shared machine.
	b.ReportMetric(float64((bench.ProcessCPU()-cpu0).Nanoseconds())/samples, "cpu-ns/sample")
	b.ReportMetric(samples/b.Elapsed().Seconds(), "samples/s")
}

// BenchmarkIngestNewSeries is BenchmarkIngest for the first request of each
// cluster, which creates its 500 series: the cost of a fleet coming back
// (catch-up) or of churn.
func BenchmarkIngestNewSeries(b *testing.B) {
	const series = 500
	clusters := b.N
	f, err := New(templates(b), clusters, series, 1)
	require.NoError(b, err)
	_, h := openIngest(b, unlimitedRates(func(s *limits.Spec) { s.MaxSeriesPerTenant = new(int) }), nil) // 0: unlimited
	bodies := make([][]byte, clusters)
	var fb Batch
	for c := range clusters {
		f.Fill(&fb, c, 0, series, 0, time.Now().Add(-time.Hour).UnixMilli(), 30_000)
		bodies[c] = encodeV1(b, fb.Series)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for c := range clusters {
		postWrite(b, h, contentTypeV1, bodies[c], f.ClusterID(c))
	}
	samples := float64(clusters * series)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/samples, "ns/sample")
}

const (
	contentTypeV1 = "application/x-protobuf;proto=prometheus.WriteRequest"
	contentTypeV2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
)

// writeRounds sends every cluster of f rounds points per series through h,
// one request per cluster and round, from t0 on.
func writeRounds(b *testing.B, h http.Handler, f *Fleet, rounds int, t0, stepMs int64) {
	var fb Batch
	for r := range rounds {
		for c := range f.Clusters() {
			f.Fill(&fb, c, 0, f.SeriesPerCluster(), r, t0, stepMs)
			postWrite(b, h, contentTypeV1, encodeV1(b, fb.Series), f.ClusterID(c))
		}
	}
}

// openIngest opens storage in a temporary directory, closed when b ends,
// and the write handler over it, with no HTTP server and no uploads.
func openIngest(b *testing.B, lim *limits.Limiter, pol *receive.Policy) (*storage.DB, http.Handler) {
	off := false
	db, err := storage.Open(slog.New(slog.DiscardHandler), nil, b.TempDir(), storage.Config{UploadOnShutdown: &off, FlushOnShutdown: &off})
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, db.Close()) })
	return db, receive.NewHandler(slog.New(slog.DiscardHandler), nil, db, lim, receive.Options{Policy: pol})
}

// unlimitedRates is a limiter without rate limits, for throughput
// benchmarks; mod may change other limits.
func unlimitedRates(mod func(*limits.Spec)) *limits.Limiter {
	inf, big := math.Inf(1), math.MaxInt32
	var c limits.Config
	c.Defaults.SamplesPerSecondPerCluster, c.Defaults.SamplesPerSecondPerTenant = &inf, &inf
	c.Defaults.BurstPerCluster, c.Defaults.BurstPerTenant = &big, &big
	if mod != nil {
		mod(&c.Defaults)
	}
	c.SetDefaults()
	return limits.New(nil, c, nil)
}

// postWrite sends one remote-write body to h as a cluster of tenant "fleet"
// and fails b unless it is stored whole (204).
func postWrite(b *testing.B, h http.Handler, contentType string, body []byte, cluster string) {
	r := httptest.NewRequest(http.MethodPost, "/api/v1/write", bytes.NewReader(body))
	r.Header.Set("Content-Type", contentType)
	r.Header.Set("Content-Encoding", "snappy")
	r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: "fleet", ClusterID: cluster}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusNoContent {
		b.Fatalf("%d: %s", rec.Code, rec.Body)
	}
}
