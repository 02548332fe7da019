package fleet

import (
	"bytes"
	"cmp"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/bench"
	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/receive"
)

const contentTypeUpload = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"

// telemeterPath is one way into the receiver's write pipeline.
type telemeterPath struct {
	name string
	// encode turns one cluster's batch into a request body, as its client
	// would (outside the timer: the encoding is the client's cost).
	encode func(tb testing.TB, series []prompb.TimeSeries) []byte
	// handler wraps the pipeline h in the route's authentication, as
	// cmd/receiver does.
	handler     func(h *receive.Handler) http.Handler
	path        string
	contentType string
	bearer      func(c int) string // the Authorization bearer of cluster c
	want        int
}

// BenchmarkReceiveTelemeter compares the receiver's cost per sample and its
// request latency on its three write routes for the same fleet: native
// remote-write 1.0 (POST /api/v1/write with the signed credential of
// /authorize), Prometheus' telemetry remote-write (POST /metrics/v1/receive
// with Telemeter's base64 JSON bearer, checked against the fleet tokens,
// without and with the cluster id hash) and telemeter-client's upload (POST
// /upload, delimited MetricFamily messages in framed snappy, with the signed
// credential). Every route runs through auth.Middleware with a real
// authenticator, the receive.Handler, the telemetry allowlist, the limiter
// and a real TSDB with its WAL; no HTTP transport.
//
// One op is one round: each of the 100 clusters sends its 224 allowlisted
// series (bench/testdata/federate-sample.prom) once, one request per cluster,
// one new point per series; the first round, which creates the series, is
// not measured. writers=N spreads a round's requests over N goroutines
// (cluster c on writer c mod N) and records each request's latency.
// Results: bench/results/telemeter.md.
func BenchmarkReceiveTelemeter(b *testing.B) {
	const (
		clusters = 100
		stepMs   = 30_000
	)
	tmpl := templates(b)
	f, err := New(tmpl, clusters, len(tmpl), 1)
	require.NoError(b, err)

	sel, err := allowlist.ReadSelectors(bytes.NewReader(bench.TelemetryAllowlist))
	require.NoError(b, err)
	pol, err := receive.NewPolicy(&receive.Config{Allowlist: sel})
	require.NoError(b, err)

	// Credentials: every cluster holds an authorize-only fleet token bound
	// to it (its pull secret) and a signed credential issued for it, as
	// /authorize would return.
	entries := make([]auth.TokenEntry, clusters)
	fleetToken := func(c int) string { return fmt.Sprintf("pull-secret-%03d", c) }
	for c := range clusters {
		entries[c] = auth.TokenEntry{Token: fleetToken(c), Tenant: "fleet", ClusterID: f.ClusterID(c), Allow: []string{"authorize"}}
	}
	tokens, err := auth.NewTokens(entries)
	require.NoError(b, err)
	_, key, err := ed25519.GenerateKey(nil)
	require.NoError(b, err)
	issuer := auth.NewIssuer(auth.NewKeySet(map[string]ed25519.PrivateKey{"k1": key}, "k1"), 24*time.Hour, nil)
	chain := auth.Chain{Issuer: issuer, Static: tokens}
	creds, telemeterBearers := make([]string, clusters), make([]string, clusters)
	for c := range clusters {
		creds[c], _, err = issuer.Issue("fleet", f.ClusterID(c))
		require.NoError(b, err)
		js, err := json.Marshal(map[string]string{"authorization_token": fleetToken(c), "cluster_id": f.ClusterID(c)})
		require.NoError(b, err)
		telemeterBearers[c] = base64.StdEncoding.EncodeToString(js)
	}
	hasher, err := auth.NewClusterIDHasher([]byte("bench-cluster-id-hash-key-0123456789"))
	require.NoError(b, err)

	cred := func(c int) string { return creds[c] }
	telemeterBearer := func(c int) string { return telemeterBearers[c] }
	paths := []telemeterPath{
		{
			name: "write-v1", encode: encodeV1, path: "/api/v1/write", contentType: contentTypeV1, bearer: cred, want: http.StatusNoContent,
			handler: func(h *receive.Handler) http.Handler {
				return auth.Middleware(chain, auth.PermWrite, h.CountUnauthenticated, h)
			},
		},
		{
			name: "receive-v1", encode: encodeV1, path: "/metrics/v1/receive", contentType: contentTypeV1, bearer: telemeterBearer, want: http.StatusNoContent,
			handler: func(h *receive.Handler) http.Handler {
				return auth.Middleware(auth.NewTelemeterBearer(nil, tokens, auth.TelemeterOptions{}), auth.PermWrite, h.CountUnauthenticated, h)
			},
		},
		{
			name: "receive-v1-hashed", encode: encodeV1, path: "/metrics/v1/receive", contentType: contentTypeV1, bearer: telemeterBearer, want: http.StatusNoContent,
			handler: func(h *receive.Handler) http.Handler {
				return auth.Middleware(auth.NewTelemeterBearer(nil, tokens, auth.TelemeterOptions{Hasher: hasher}), auth.PermWrite, h.CountUnauthenticated, h)
			},
		},
		{
			name: "upload", encode: encodeUpload, path: "/upload", contentType: contentTypeUpload, bearer: cred, want: http.StatusOK,
			handler: func(h *receive.Handler) http.Handler {
				return auth.Middleware(chain, auth.PermWrite, h.CountUnauthenticated, http.HandlerFunc(h.ServeUpload))
			},
		},
	}
	for _, writers := range []int{1, 4} {
		for _, p := range paths {
			b.Run(fmt.Sprintf("writers=%d/path=%s", writers, p.name), func(b *testing.B) {
				benchmarkTelemeterPath(b, f, p, pol, writers, stepMs)
			})
		}
	}
}

func benchmarkTelemeterPath(b *testing.B, f *Fleet, p telemeterPath, pol *receive.Policy, writers int, stepMs int64) {
	clusters, series := f.Clusters(), f.SeriesPerCluster()
	_, wh := openIngest(b, unlimitedRates(nil), pol)
	h := p.handler(wh.(*receive.Handler))

	// Rounds of bodies, encoded up front; when they run out, the next time
	// range is encoded with the timer stopped.
	const rounds = 16
	t0 := time.Now().Add(-2 * time.Hour).UnixMilli()
	bodies := make([][][]byte, rounds)
	var fb Batch
	encodeRounds := func() {
		for r := range rounds {
			bodies[r] = make([][]byte, clusters)
			for c := range clusters {
				f.Fill(&fb, c, 0, series, r, t0, stepMs)
				bodies[r][c] = p.encode(b, fb.Series)
			}
		}
	}
	encodeRounds()
	wire := 0
	for _, body := range bodies[1] {
		wire += len(body)
	}
	send := func(c int, body []byte) error {
		r := httptest.NewRequest(http.MethodPost, p.path, bytes.NewReader(body))
		r.Header.Set("Content-Type", p.contentType)
		r.Header.Set("Content-Encoding", "snappy")
		r.Header.Set("Authorization", "Bearer "+p.bearer(c))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != p.want {
			return fmt.Errorf("%s cluster %d: %d: %s", p.name, c, rec.Code, rec.Body)
		}
		return nil
	}
	for c := range clusters { // creates the series and warms the credential caches
		require.NoError(b, send(c, bodies[0][c]))
	}

	lat := make([][]time.Duration, writers)
	errs := make([]error, writers)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	cpu0, mallocs0, bytes0 := bench.ProcessCPU(), ms.Mallocs, ms.TotalAlloc
	b.SetBytes(int64(wire))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		r := 1 + n%(rounds-1)
		if r == 1 && n > 0 {
			// Out of fresh points: the same series, a later time range.
			b.StopTimer()
			pause := bench.ProcessCPU()
			runtime.ReadMemStats(&ms)
			m, by := ms.Mallocs, ms.TotalAlloc
			t0 += rounds * stepMs
			encodeRounds()
			runtime.GC() // the encoding's garbage is not the receiver's
			runtime.ReadMemStats(&ms)
			mallocs0 += ms.Mallocs - m
			bytes0 += ms.TotalAlloc - by
			cpu0 += bench.ProcessCPU() - pause
			b.StartTimer()
		}
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				for c := w; c < clusters; c += writers {
					start := time.Now()
					if err := send(c, bodies[r][c]); err != nil {
						errs[w] = err
						return
					}
					lat[w] = append(lat[w], time.Since(start))
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		n++
	}
	cpu := bench.ProcessCPU() - cpu0
	runtime.ReadMemStats(&ms)
	requests := float64(n * clusters)
	samples := requests * float64(series)
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/samples, "ns/sample")
	// CPU of the whole process (GC included, the re-encoding excluded):
	// steadier than wall time on a shared machine.
	b.ReportMetric(float64(cpu.Nanoseconds())/samples, "cpu-ns/sample")
	b.ReportMetric(samples/b.Elapsed().Seconds(), "samples/s")
	b.ReportMetric(float64(ms.TotalAlloc-bytes0)/requests, "B/request")
	b.ReportMetric(float64(ms.Mallocs-mallocs0)/requests, "allocs/request")
	b.ReportMetric(float64(wire)/float64(clusters*series), "wire-B/sample")
	b.ReportMetric(quantile(all, 0.5).Seconds()*1e3, "p50-ms")
	b.ReportMetric(quantile(all, 0.99).Seconds()*1e3, "p99-ms")
}

// quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// encodeUpload encodes a cluster's batch as telemeter-client uploads it:
// one untyped family per metric name, every metric with its timestamp, as
// delimited MetricFamily messages in framed snappy (forward.EncodeTelemeter:
// expfmt's delimited encoder into snappy.NewBufferedWriter). The label
// pairs come in telemeter-client's order, not sorted: the federated
// series' labels, then the external labels Prometheus appends (the
// fixture's instance, prometheus, prometheus_replica), then the _id that
// telemeter-client's --label adds last.
func encodeUpload(tb testing.TB, series []prompb.TimeSeries) []byte {
	families, skipped := forward.TelemeterFamilies(&prompb.WriteRequest{Timeseries: series}, nil)
	require.Zero(tb, skipped)
	appended := map[string]int{"instance": 1, "prometheus": 2, "prometheus_replica": 3, ClusterLabel: 4}
	for _, mf := range families {
		for _, m := range mf.Metric {
			// TelemeterFamilies shares a series' pairs between its samples;
			// one sample per series here, so sorting in place is safe.
			slices.SortStableFunc(m.Label, func(a, b *dto.LabelPair) int {
				return cmp.Compare(appended[a.GetName()], appended[b.GetName()])
			})
		}
	}
	body, err := forward.EncodeTelemeter(families)
	require.NoError(tb, err)
	return body
}
