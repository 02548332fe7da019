// Package noisy measures what a noisy neighbour costs a well-behaved
// cluster: the calm cluster's write latency alone, and while another cluster
// of the same tenant blows through its series and rate limits as fast as it
// can. The calm cluster writes 50 series every 10ms, inside its limits; the
// noisy one sends 500 new series per request from two goroutines, so it is
// refused by the series limit (1000 per cluster) and the rate limit.
// Run: go test -run '^$' -bench . -benchtime 300x -count 5 ./bench/noisy/
package noisy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/receive"
	"github.com/phonehome/phonehome/storage"
)

func newServer(b *testing.B) *httptest.Server {
	b.Helper()
	var scfg storage.Config
	scfg.SetDefaults()
	db, err := storage.Open(slog.New(slog.DiscardHandler), nil, b.TempDir(), scfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	var lcfg limits.Config
	perCluster, rate, burst := 1000, 10000.0, 20000
	lcfg.Defaults.MaxSeriesPerCluster = &perCluster
	lcfg.Defaults.SamplesPerSecondPerCluster = &rate
	lcfg.Defaults.BurstPerCluster = &burst
	lcfg.SetDefaults()
	tokens, err := auth.NewTokens([]auth.TokenEntry{
		{Token: "calm", Tenant: "acme", ClusterID: "calm"},
		{Token: "noisy", Tenant: "acme", ClusterID: "noisy"},
	})
	if err != nil {
		b.Fatal(err)
	}
	h := receive.NewHandler(slog.New(slog.DiscardHandler), nil, db, limits.New(nil, lcfg, nil), receive.Options{})
	srv := httptest.NewServer(auth.Middleware(tokens, auth.PermWrite, nil, h))
	b.Cleanup(srv.Close)
	return srv
}

func body(b *testing.B, name string, series int, ts int64, fresh string) []byte {
	b.Helper()
	req := &prompb.WriteRequest{}
	for i := range series {
		req.Timeseries = append(req.Timeseries, prompb.TimeSeries{
			Labels:  []prompb.Label{{Name: "__name__", Value: name}, {Name: "n", Value: fmt.Sprint(fresh, i)}},
			Samples: []prompb.Sample{{Value: float64(ts), Timestamp: ts}},
		})
	}
	raw, err := req.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	return snappy.Encode(nil, raw)
}

func post(url, token string, b []byte) (int, error) {
	r, err := http.NewRequest(http.MethodPost, url+"/api/v1/write", bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	r.Header.Set("Content-Type", "application/x-protobuf")
	r.Header.Set("Content-Encoding", "snappy")
	r.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

func BenchmarkCalmClusterLatency(b *testing.B) {
	for _, noisy := range []bool{false, true} {
		b.Run(fmt.Sprintf("noisy_neighbour=%v", noisy), func(b *testing.B) {
			srv := newServer(b)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var noisyReqs, noisyRefused atomic.Int64
			if noisy {
				// Bodies are encoded up front, so the generator competes less
				// with the receiver for the two cores.
				bodies := make([][]byte, 200)
				for i := range bodies {
					bodies[i] = body(b, "noise", 500, time.Now().UnixMilli(), fmt.Sprintf("%d-", i))
				}
				for w := range 2 {
					wg.Go(func() {
						for i := w; ctx.Err() == nil; i++ {
							code, err := post(srv.URL, "noisy", bodies[i%len(bodies)])
							if err == nil {
								noisyReqs.Add(1)
								if code != http.StatusNoContent {
									noisyRefused.Add(1)
								}
							}
						}
					})
				}
			}
			start := time.Now().Add(-time.Hour).UnixMilli()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			tick := time.NewTicker(10 * time.Millisecond) // 5000 samples/s: within the calm cluster's limits
			defer tick.Stop()
			for i := 0; b.Loop(); i++ {
				<-tick.C
				payload := body(b, "calm", 50, start+int64(i)*1000, "")
				t0 := time.Now()
				code, err := post(srv.URL, "calm", payload)
				lat = append(lat, time.Since(t0))
				if err != nil || code != http.StatusNoContent {
					b.Fatalf("calm write %d: %d %v", i, code, err)
				}
			}
			b.StopTimer()
			cancel()
			wg.Wait()
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			if noisy {
				b.ReportMetric(float64(noisyReqs.Load()), "noisy-requests")
				b.ReportMetric(float64(noisyRefused.Load()), "noisy-refused")
			}
		})
	}
}
