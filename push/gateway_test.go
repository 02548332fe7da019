package push

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientpush "github.com/prometheus/client_golang/prometheus/push"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/atomicfile"
	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeWriter keeps the last value written per tenant and series.
type fakeWriter struct {
	mu     sync.Mutex
	values map[string]map[string]float64
	ts     int64
}

func (f *fakeWriter) Write(_ context.Context, tenant string, series []prompb.TimeSeries) (storage.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.values == nil {
		f.values = map[string]map[string]float64{}
	}
	if f.values[tenant] == nil {
		f.values[tenant] = map[string]float64{}
	}
	for _, s := range series {
		b := labels.NewScratchBuilder(len(s.Labels))
		for _, l := range s.Labels {
			b.Add(l.Name, l.Value)
		}
		for _, smp := range s.Samples {
			f.values[tenant][b.Labels().String()] = smp.Value
			f.ts = smp.Timestamp
		}
	}
	return storage.Stats{Samples: len(series)}, nil
}

func (f *fakeWriter) get(tenant string) map[string]float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]float64{}
	for k, v := range f.values[tenant] {
		out[k] = v
	}
	return out
}

// tokenAuth maps bearer tokens to tenants, and "tenant/cluster" to a
// cluster-bound credential.
type tokenAuth map[string]string

func (a tokenAuth) Authenticate(r *http.Request) (auth.Identity, error) {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if t, ok := a[tok]; ok {
		tenant, cluster, _ := strings.Cut(t, "/")
		return auth.Identity{Tenant: tenant, ClusterID: cluster, Allow: auth.PermWrite}, nil
	}
	return auth.Identity{}, auth.ErrUnauthorized
}

type fixture struct {
	t       *testing.T
	replica string // Options.Replica
	denied  func(tenant, clusterID string) bool
	dir     string
	cfg     Config
	w       *fakeWriter
	now     time.Time
	reg     *prometheus.Registry
	gw      *Gateway
	srv     *httptest.Server
}

func testConfig() Config {
	cfg := Config{AllowedMetrics: []string{"installs_total", "install_seconds", "temperature", "cluster_installation_invocation", "some_summary"}}
	cfg.SetDefaults()
	return cfg
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	f := &fixture{t: t, dir: t.TempDir(), cfg: cfg, w: &fakeWriter{}, now: time.Unix(1_800_000_000, 0)}
	f.open()
	return f
}

func (f *fixture) open() {
	f.t.Helper()
	require.NoError(f.t, f.cfg.Validate())
	f.reg = prometheus.NewRegistry()
	gw, err := Open(slog.New(slog.DiscardHandler), f.reg, f.dir, f.w, f.cfg, Options{Now: func() time.Time { return f.now }, Replica: f.replica, Denied: f.denied})
	require.NoError(f.t, err)
	f.gw = gw
	mux := http.NewServeMux()
	for _, p := range Patterns {
		mux.Handle(p, auth.Middleware(tokenAuth{"tok-a": "acme", "tok-b": "other", "tok-c1": "acme/c1", "tok-c2": "acme/c2"}, auth.PermWrite, gw.CountUnauthenticated, gw))
	}
	f.srv = httptest.NewServer(mux)
	f.t.Cleanup(f.close)
}

// close simulates a crash: no flush, the log file is just closed.
func (f *fixture) close() {
	if f.srv == nil {
		return
	}
	f.srv.Close()
	require.NoError(f.t, f.gw.Close())
	f.srv = nil
}

func (f *fixture) reopen() {
	f.close()
	f.w = &fakeWriter{}
	f.open()
}

func (f *fixture) push(method, path, token, contentType, body string) (int, string, http.Header) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	require.NoError(f.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := f.srv.Client().Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	var sb strings.Builder
	_, _ = fmt.Fprint(&sb, readAll(resp))
	return resp.StatusCode, sb.String(), resp.Header
}

func readAll(resp *http.Response) string {
	b := make([]byte, 4096)
	n, _ := resp.Body.Read(b)
	return string(b[:n])
}

// state flushes and returns what the tenant's TSDB would hold.
func (f *fixture) state(tenant string) map[string]float64 {
	f.t.Helper()
	f.gw.Flush(context.Background())
	return f.w.get(tenant)
}

const counterText = "# TYPE installs_total counter\ninstalls_total{platform=\"aws\",result=\"ok\"} 1\ninstalls_total{platform=\"gcp\",result=\"fail\"} 2\n"

func TestPushSumsCountersAcrossPushes(t *testing.T) {
	f := newFixture(t, testConfig())
	for i := 0; i < 3; i++ {
		code, body, _ := f.push(http.MethodPut, "/metrics/job/installer/version/4.2", "tok-a", "", counterText)
		require.Equal(t, http.StatusOK, code, body)
	}
	code, body, _ := f.push(http.MethodPost, "/metrics/job/installer/version/4.3", "tok-a", "text/plain; version=0.0.4", counterText)
	require.Equal(t, http.StatusOK, code, body)
	// Another tenant's pushes stay apart.
	code, body, _ = f.push(http.MethodPost, "/metrics/job/installer/version/4.2", "tok-b", "application/x-www-form-urlencoded", counterText)
	require.Equal(t, http.StatusOK, code, body)

	require.Equal(t, map[string]float64{
		`{__name__="installs_total", job="installer", platform="aws", result="ok", version="4.2"}`:   3,
		`{__name__="installs_total", job="installer", platform="gcp", result="fail", version="4.2"}`: 6,
		`{__name__="installs_total", job="installer", platform="aws", result="ok", version="4.3"}`:   1,
		`{__name__="installs_total", job="installer", platform="gcp", result="fail", version="4.3"}`: 2,
	}, f.state("acme"))
	require.Len(t, f.state("other"), 2)
	require.Equal(t, f.now.UnixMilli(), f.w.ts)
	require.Equal(t, 5.0, testutil.ToFloat64(f.gw.metrics.acceptedPushes))
	require.Equal(t, 5.0, testutil.ToFloat64(f.gw.metrics.requests.WithLabelValues("200")))
}

func TestPushRealClientGolangProtobufAndHistogram(t *testing.T) {
	f := newFixture(t, testConfig())
	for i := 0; i < 2; i++ {
		reg := prometheus.NewRegistry()
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "installs_total", Help: "h"}, []string{"platform"})
		c.WithLabelValues("aws").Add(2)
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "install_seconds", Help: "h", Buckets: []float64{60, 600}})
		h.Observe(30)
		h.Observe(300)
		reg.MustRegister(c, h)
		p := clientpush.New(f.srv.URL, "installer").Gatherer(reg).Grouping("path", "a/b").
			Header(http.Header{"Authorization": {"Bearer tok-a"}})
		if i == 0 {
			require.NoError(t, p.Push())
		} else {
			require.NoError(t, p.Add())
		}
	}
	require.Equal(t, map[string]float64{
		`{__name__="installs_total", job="installer", path="a/b", platform="aws"}`:    4,
		`{__name__="install_seconds_bucket", job="installer", le="60", path="a/b"}`:   2,
		`{__name__="install_seconds_bucket", job="installer", le="600", path="a/b"}`:  4,
		`{__name__="install_seconds_bucket", job="installer", le="+Inf", path="a/b"}`: 4,
		`{__name__="install_seconds_sum", job="installer", path="a/b"}`:               660,
		`{__name__="install_seconds_count", job="installer", path="a/b"}`:             4,
	}, f.state("acme"))
}

func TestPushRejectionsChangeNothing(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBodyBytes = 1024
	cfg.MaxSeriesPerTenant = 6 // 2 counters + 2 buckets, sum and count
	f := newFixture(t, cfg)
	const hist = "# TYPE install_seconds histogram\ninstall_seconds_bucket{le=\"1\"} 1\ninstall_seconds_bucket{le=\"+Inf\"} 2\ninstall_seconds_sum 3\ninstall_seconds_count 2\n"
	for range 2 { // pushed more than once and not idle: the series budget evicts none of them
		code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
		require.Equal(t, http.StatusOK, code, body)
		code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", hist)
		require.Equal(t, http.StatusOK, code, body)
	}
	before := f.state("acme")

	for _, tc := range []struct {
		name, path, token, ct, body string
		code                        int
		reason                      string
	}{
		{"no token", "/metrics/job/i", "", "", counterText, 401, reasonUnauthenticated},
		{"bad token", "/metrics/job/i", "nope", "", counterText, 401, reasonUnauthenticated},
		{"untyped", "/metrics/job/i", "tok-a", "", "installs_total 1\n", 400, reasonUntyped},
		{"not allowlisted", "/metrics/job/i", "tok-a", "", "# TYPE evil_total counter\nevil_total 1\n", 400, reasonNotAllowed},
		{"type mismatch", "/metrics/job/i", "tok-a", "", "# TYPE installs_total gauge\ninstalls_total 1\n", 400, reasonTypeMismatch},
		{"bucket mismatch", "/metrics/job/i", "tok-a", "", strings.ReplaceAll(hist, `le="1"`, `le="2"`), 400, reasonBucketMismatch},
		{"label conflict", "/metrics/job/i/platform/x", "tok-a", "", counterText, 400, reasonLabelConflict},
		{"job label conflict", "/metrics/job/i", "tok-a", "", "# TYPE installs_total counter\ninstalls_total{job=\"j\"} 1\n", 400, reasonLabelConflict},
		{"reserved label", "/metrics/job/i", "tok-a", "", "# TYPE installs_total counter\ninstalls_total{__x=\"1\"} 1\n", 400, reasonInvalidLabel},
		{"replica label", "/metrics/job/i", "tok-a", "", "# TYPE installs_total counter\ninstalls_total{push_replica=\"r9\"} 1\n", 400, reasonInvalidLabel},
		{"replica grouping label", "/metrics/job/i/push_replica/r9", "tok-a", "", counterText, 400, reasonInvalidLabel},
		{"long label value", "/metrics/job/i", "tok-a", "", "# TYPE installs_total counter\ninstalls_total{a=\"" + strings.Repeat("x", 300) + "\"} 1\n", 400, reasonInvalidLabel},
		{"cluster id claimed", "/metrics/job/i", "tok-a", "", "# TYPE installs_total counter\ninstalls_total{_id=\"c1\"} 1\n", 400, reasonClusterID},
		{"negative counter", "/metrics/job/i", "tok-a", "", "# TYPE installs_total counter\ninstalls_total -1\n", 400, reasonInvalidValue},
		{"summary", "/metrics/job/i", "tok-a", "", "# TYPE some_summary summary\nsome_summary_sum 1\nsome_summary_count 1\n", 400, reasonUnsupportedType},
		{"parse error", "/metrics/job/i", "tok-a", "", "# TYPE installs_total counter\ninstalls_total{ 1\n", 400, reasonParse},
		{"series limit", "/metrics/job/i", "tok-a", "", "# TYPE installs_total counter\ninstalls_total{new=\"1\"} 1\n", 400, reasonSeriesLimit},
		{"too large", "/metrics/job/i", "tok-a", "", counterText + "#" + strings.Repeat("x", 1100) + "\n", 413, reasonTooLarge},
		{"json", "/metrics/job/i", "tok-a", "application/json", "{}", 415, reasonUnsupported},
		{"proto not delimited", "/metrics/job/i", "tok-a", "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=text", "", 415, reasonUnsupported},
		{"empty job", "/metrics/job//a/b", "tok-a", "", counterText, 400, reasonInvalidPath},
		{"odd path", "/metrics/job/i/a", "tok-a", "", counterText, 400, reasonInvalidPath},
		{"bad base64", "/metrics/job/i/a@base64/!!", "tok-a", "", counterText, 400, reasonInvalidPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r0 := testutil.ToFloat64(f.gw.metrics.rejected.WithLabelValues(tc.reason))
			code, body, _ := f.push(http.MethodPost, tc.path, tc.token, tc.ct, tc.body)
			require.Equal(t, tc.code, code, body)
			require.NotEmpty(t, strings.TrimSpace(body))
			require.Equal(t, r0+1, testutil.ToFloat64(f.gw.metrics.rejected.WithLabelValues(tc.reason)))
			require.Equal(t, before, f.state("acme"))
		})
	}
}

func TestPushGaugePolicies(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   float64
	}{{GaugeSum, 7}, {GaugeLast, 4}} {
		t.Run(tc.policy, func(t *testing.T) {
			cfg := testConfig()
			cfg.GaugePolicy = tc.policy
			f := newFixture(t, cfg)
			for _, v := range []string{"3", "4"} {
				code, body, _ := f.push(http.MethodPut, "/metrics/job/i", "tok-a", "", "# TYPE temperature gauge\ntemperature "+v+"\n")
				require.Equal(t, http.StatusOK, code, body)
			}
			require.Equal(t, map[string]float64{`{__name__="temperature", job="i"}`: tc.want}, f.state("acme"))
		})
	}
}

func TestPushRateLimit(t *testing.T) {
	cfg := testConfig()
	cfg.RateLimit = RateLimit{RequestsPerSecond: 0.5, Burst: 2}
	f := newFixture(t, cfg)
	for i := 0; i < 2; i++ {
		code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
		require.Equal(t, http.StatusOK, code, body)
	}
	code, _, hdr := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusTooManyRequests, code)
	require.Equal(t, "2", hdr.Get("Retry-After"))
	// Another token has its own bucket.
	code, _, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-b", "", counterText)
	require.Equal(t, http.StatusOK, code)
	f.now = f.now.Add(2 * time.Second)
	code, _, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 3.0, f.state("acme")[`{__name__="installs_total", job="i", platform="aws", result="ok"}`])
	require.Equal(t, 1.0, testutil.ToFloat64(f.gw.metrics.rejected.WithLabelValues(reasonRateLimited)))
}

func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want string
		err  bool
	}{
		{"/metrics/job/installer", `{job="installer"}`, false},
		{"/metrics/job/installer/", `{job="installer"}`, false},
		{"/metrics/job/a%2Fb/os/linux", `{job="a/b", os="linux"}`, false},
		{"/metrics/job@base64/YS9i/os@base64/bGludXg", `{job="a/b", os="linux"}`, false},
		{"/metrics/job/i/empty@base64/=", `{empty="", job="i"}`, false},
		{"/metrics/job/i/os", "", true},
		{"/metrics/foo/i", "", true},
		{"/metrics/job/i/job/j", "", true},
		{"/metrics/job/i/1bad/x", "", true},
	} {
		ls, err := parsePath(tc.path)
		if tc.err {
			require.Error(t, err, tc.path)
			continue
		}
		require.NoError(t, err, tc.path)
		b := labels.NewScratchBuilder(len(ls))
		for _, l := range ls {
			b.Add(l.Name, l.Value)
		}
		b.Sort()
		require.Equal(t, tc.want, b.Labels().String(), tc.path)
	}
}

func TestPushDurableAcrossCrashAndCompaction(t *testing.T) {
	f := newFixture(t, testConfig())
	key := `{__name__="installs_total", job="i", platform="aws", result="ok"}`
	pushN := func(n int) {
		for i := 0; i < n; i++ {
			code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
			require.Equal(t, http.StatusOK, code, body)
		}
	}
	pushN(3)
	f.reopen() // crash without any flush: the log alone recovers
	require.Equal(t, 3.0, f.state("acme")[key])

	pushN(2) // the state() above compacted; these land in the log after the snapshot
	logBefore, err := os.ReadFile(filepath.Join(f.dir, logFile))
	require.NoError(t, err)
	f.gw.Flush(context.Background()) // snapshot at 5, log emptied
	// Crash between the snapshot rename and the log truncation: the old log
	// reappears; replay must skip what the snapshot holds.
	f.close()
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, logFile), logBefore, 0o640))
	f.w = &fakeWriter{}
	f.open()
	require.Equal(t, 5.0, f.state("acme")[key])

	// A torn tail (a push that crashed mid-write, never acknowledged) is dropped.
	pushN(1)
	f.close()
	lf, err := os.OpenFile(filepath.Join(f.dir, logFile), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = lf.Write([]byte{200, 0, 0, 0, 1, 2, 3, 4, '{'})
	require.NoError(t, err)
	require.NoError(t, lf.Close())
	f.w = &fakeWriter{}
	f.open()
	require.Equal(t, 6.0, f.state("acme")[key])
	pushN(1)
	f.reopen()
	require.Equal(t, 7.0, f.state("acme")[key])
}

func TestPushConcurrentSumsExact(t *testing.T) {
	cfg := testConfig()
	cfg.RateLimit = RateLimit{RequestsPerSecond: 1e6, Burst: 1e6}
	f := newFixture(t, cfg)
	const n = 200
	var wg sync.WaitGroup
	codes := make(chan int, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/metrics/job/i", strings.NewReader(counterText))
			req.Header.Set("Authorization", "Bearer tok-a")
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				codes <- 0
				return
			}
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		require.Equal(t, http.StatusOK, c)
	}
	f.reopen()
	st := f.state("acme")
	require.Equal(t, float64(n), st[`{__name__="installs_total", job="i", platform="aws", result="ok"}`])
	require.Equal(t, float64(2*n), st[`{__name__="installs_total", job="i", platform="gcp", result="fail"}`])
}

func TestConfigValidate(t *testing.T) {
	cfg := Config{AllowedMetrics: []string{"ok", "1bad", "ok"}, GaugePolicy: "max", FlushInterval: 1, MaxBodyBytes: -1}
	cfg.SetDefaults()
	err := cfg.Validate()
	require.Error(t, err)
	for _, want := range []string{`push.allowed_metrics[1] "1bad"`, `push.allowed_metrics[2] "ok": duplicate`, "push.gauge_policy", "push.flush_interval", "push.max_body_bytes"} {
		require.Contains(t, err.Error(), want)
	}
	short := Config{FlushInterval: mustDuration(t, "1m"), SeriesTTL: mustDuration(t, "30s")}
	short.SetDefaults()
	err = short.Validate()
	require.Error(t, err)
	for _, want := range []string{"push.series_ttl: 30s is shorter than push.flush_interval (1m)"} {
		require.Contains(t, err.Error(), want)
	}
	def := Config{}
	def.SetDefaults()
	require.NoError(t, def.Validate())
	require.Contains(t, def.AllowedMetrics, "cluster_installation_invocation")
	require.Equal(t, "30d", def.SeriesTTL.String())
}

// A process killed while writing the snapshot or the rewritten log leaves
// a temporary file; the next start removes it, and nothing else.
func TestOpenRemovesTemporaryFilesOfACrash(t *testing.T) {
	f := newFixture(t, testConfig())
	code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusOK, code, body)
	f.close()
	for _, name := range []string{snapshotFile, logFile} {
		_, err := atomicfile.Prepare(filepath.Join(f.dir, name), []byte("torn"), 0o640)
		require.NoError(t, err)
	}
	f.w = &fakeWriter{}
	f.open()
	entries, err := os.ReadDir(f.dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.NotContains(t, e.Name(), ".tmp", "left by the crash")
	}
	require.Equal(t, 1.0, f.state("acme")[`{__name__="installs_total", job="i", platform="aws", result="ok"}`])
}
