package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/bench"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func templates(t testing.TB) []Template {
	t.Helper()
	tmpl, err := LoadTemplateFiles(bench.FederateSample, bench.TelemetryAllowlist)
	require.NoError(t, err)
	return tmpl
}

func TestLoadTemplates(t *testing.T) {
	tmpl := templates(t)
	require.Len(t, tmpl, 224, "the fixture documents 224 allowlisted series")

	all, err := LoadTemplateFiles(bench.FederateSample, nil)
	require.NoError(t, err)
	require.Len(t, all, 300)

	for _, tp := range tmpl {
		require.NotEmpty(t, tp.Labels.Get(model.MetricNameLabel))
		require.Equal(t, "5f6c2a9e-3b1d-4c7e-9a0f-2d8e4b6c1a73", tp.Labels.Get(ClusterLabel))
	}
}

func TestFleetShape(t *testing.T) {
	tmpl := templates(t)
	for _, tc := range []struct {
		name              string
		clusters, perClus int
	}{
		{"fewer than templates", 3, 100},
		{"one copy", 2, 224},
		{"several copies", 4, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := New(tmpl, tc.clusters, tc.perClus, 7)
			require.NoError(t, err)
			require.Equal(t, tc.clusters*tc.perClus, f.ActiveSeries())

			seen := map[string]struct{}{}
			ids := map[string]struct{}{}
			var b Batch
			for c := range tc.clusters {
				ids[f.ClusterID(c)] = struct{}{}
				f.Fill(&b, c, 0, tc.perClus, 0, 1_767_268_800_000, 270_000)
				require.Len(t, b.Series, tc.perClus)
				for _, s := range b.Series {
					ls := toLabels(s.Labels)
					require.True(t, isSorted(s.Labels), "labels not sorted: %v", ls)
					require.NoError(t, ls.Validate(func(l labels.Label) error {
						if l.Value == "" {
							return fmt.Errorf("empty value for %s", l.Name)
						}
						return nil
					}))
					require.Equal(t, f.ClusterID(c), ls.Get(ClusterLabel))
					_, dup := seen[ls.String()]
					require.False(t, dup, "duplicate series %s", ls)
					seen[ls.String()] = struct{}{}
				}
			}
			require.Len(t, ids, tc.clusters, "cluster ids must be distinct")
		})
	}
}

func TestFleetDeterministicAndMonotonic(t *testing.T) {
	tmpl := templates(t)
	f1, err := New(tmpl, 3, 500, 42)
	require.NoError(t, err)
	f2, err := New(tmpl, 3, 500, 42)
	require.NoError(t, err)
	other, err := New(tmpl, 3, 500, 43)
	require.NoError(t, err)
	require.NotEqual(t, f1.ClusterID(0), other.ClusterID(0))

	var b1, b2, prev Batch
	for r := range 4 {
		f1.Fill(&b1, 2, 0, 500, r, 1_000_000, 270_000)
		f2.Fill(&b2, 2, 0, 500, r, 1_000_000, 270_000)
		require.Equal(t, b1.Series, b2.Series)
		if r > 0 {
			for i, s := range b1.Series {
				p := prev.Series[i].Samples[0]
				require.Greater(t, s.Samples[0].Timestamp, p.Timestamp)
				require.GreaterOrEqual(t, s.Samples[0].Value, p.Value, "series %v", s.Labels)
			}
		}
		prev = Batch{Series: cloneSeries(b1.Series)}
	}
}

func TestRun(t *testing.T) {
	var (
		mu      sync.Mutex
		samples int
		tokens  = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		raw, err := snappy.Decode(nil, body)
		if err != nil || r.Header.Get("Content-Encoding") != "snappy" || r.Header.Get("X-Prometheus-Remote-Write-Version") != "0.1.0" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		var req prompb.WriteRequest
		if err := req.Unmarshal(raw); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]++
		clusters := map[string]struct{}{}
		for _, s := range req.Timeseries {
			samples += len(s.Samples)
			clusters[toLabels(s.Labels).Get(ClusterLabel)] = struct{}{}
		}
		if len(clusters) != 1 {
			http.Error(w, "request spans clusters", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	f, err := New(templates(t), 5, 300, 1)
	require.NoError(t, err)
	res, err := Run(context.Background(), f, Options{
		URL: srv.URL, Token: "tok", Rounds: 3, Concurrency: 4, BatchSeries: 128,
		Client: srv.Client(),
	})
	require.NoError(t, err)
	require.Equal(t, 3, res.RoundsDone)
	require.Equal(t, int64(5*300*3), res.Accepted)
	require.Equal(t, int64(5*3*3), res.Requests) // ceil(300/128) = 3 per cluster per round
	require.Equal(t, map[string]int64{"204": 45}, res.Codes)
	require.Equal(t, 5*300*3, samples)
	require.Equal(t, map[string]int{"tok": 45}, tokens)
	require.Len(t, res.PerRound, 3)
}

func TestRunPreEncodedSendsTheSameBodies(t *testing.T) {
	var (
		mu     sync.Mutex
		bodies = map[bool]map[string]int{true: {}, false: {}}
		pre    bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		bodies[pre][string(body)]++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	f, err := New(templates(t), 4, 250, 9)
	require.NoError(t, err)
	start := time.Unix(1_767_268_800, 0)
	for _, p := range []bool{false, true} {
		pre = p
		res, err := Run(context.Background(), f, Options{
			URL: srv.URL, Rounds: 2, Concurrency: 3, BatchSeries: 100, Start: start, PreEncode: p, Client: srv.Client(),
		})
		require.NoError(t, err)
		require.Equal(t, int64(4*250*2), res.Accepted)
	}
	require.Len(t, bodies[false], 4*3*2)
	require.Equal(t, bodies[false], bodies[true])
}

func TestRunStopsOnContext(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	f, err := New(templates(t), 2, 10, 1)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Run(ctx, f, Options{URL: srv.URL, Rounds: 1000, Interval: time.Hour, Client: srv.Client()})
	require.NoError(t, err)
	require.NotEmpty(t, res.Aborted)
	require.Zero(t, res.RoundsDone)
}

func BenchmarkEncode(b *testing.B) {
	tmpl := templates(b)
	for _, batch := range []int{100, 500, 2000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			f, err := New(tmpl, 10, batch, 1)
			require.NoError(b, err)
			o := Options{Step: 270 * time.Second, Start: time.Unix(1_767_268_800, 0)}
			s := sender{f: f, o: &o}
			body, err := s.encode(job{c: 0, from: 0, to: batch})
			require.NoError(b, err)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			r := 0
			for b.Loop() {
				if _, err := s.encode(job{c: r % 10, from: 0, to: batch, r: r}); err != nil {
					b.Fatal(err)
				}
				r++
			}
			b.ReportMetric(float64(r*batch)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}

func toLabels(ls []prompb.Label) labels.Labels {
	b := labels.NewScratchBuilder(len(ls))
	for _, l := range ls {
		b.Add(l.Name, l.Value)
	}
	return b.Labels()
}

func isSorted(ls []prompb.Label) bool {
	for i := 1; i < len(ls); i++ {
		if ls[i-1].Name >= ls[i].Name {
			return false
		}
	}
	return true
}

func cloneSeries(in []prompb.TimeSeries) []prompb.TimeSeries {
	out := make([]prompb.TimeSeries, len(in))
	for i, s := range in {
		out[i] = prompb.TimeSeries{
			Labels:  append([]prompb.Label(nil), s.Labels...),
			Samples: append([]prompb.Sample(nil), s.Samples...),
		}
	}
	return out
}

func TestChurnReplacesTheConfiguredFractionPerHour(t *testing.T) {
	f0, err := New(templates(t), 50, 500, 9)
	require.NoError(t, err)
	const step = 270_000 // 4m30s
	f := f0.WithChurn(0.03, 0.07)
	require.Equal(t, f0.ActiveSeries(), f.DistinctSeries(1, step), "nothing churns before the first hour")

	seriesAt := func(r int) map[string]struct{} {
		out := map[string]struct{}{}
		var b Batch
		for c := range f.Clusters() {
			f.Fill(&b, c, 0, f.SeriesPerCluster(), r, 0, step)
			for _, s := range b.Series {
				out[toLabels(s.Labels).String()] = struct{}{}
			}
		}
		return out
	}
	first, afterHour := seriesAt(0), seriesAt(int(time.Hour/(step*time.Millisecond))*4) // 4 hours later
	require.Len(t, afterHour, f.ActiveSeries(), "churn replaces series, it does not add active ones")
	gone := 0
	for k := range first {
		if _, ok := afterHour[k]; !ok {
			gone++
		}
	}
	// About 1-(1-0.03)(1-0.07)^... ≈ 4 × 10% of the series are replaced after 4 hours.
	frac := float64(gone) / float64(len(first))
	require.InDelta(t, 0.37, frac, 0.05, "replaced fraction after 4h")

	// 80 rounds = 5h55m30s: DistinctSeries counts every generation (with only
	// 50 clusters, the cluster part is noisy).
	require.InEpsilon(t, float64(f.ActiveSeries())*(1+0.10*5.925), float64(f.DistinctSeries(80, step)), 0.08)

	// Churned series keep valid, sorted labels and distinct identities.
	var b Batch
	f.Fill(&b, 3, 0, 500, 79, 0, step)
	for _, s := range b.Series {
		require.True(t, isSorted(s.Labels))
	}
}
