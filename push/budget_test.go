package push

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// held is what the tenant's aggregate holds now (the fake TSDB keeps every
// series ever written).
func (f *fixture) held(tenant string) map[string]float64 {
	f.gw.mu.Lock()
	defer f.gw.mu.Unlock()
	out := map[string]float64{}
	if ts := f.gw.state[tenant]; ts != nil {
		for _, it := range ts.Series {
			out[it.Labels.String()] = it.Value
		}
	}
	return out
}

func counterPush(labelSets ...string) string {
	var b strings.Builder
	b.WriteString("# TYPE installs_total counter\n")
	for _, ls := range labelSets {
		fmt.Fprintf(&b, "installs_total{%s} 1\n", ls)
	}
	return b.String()
}

func junk(n int) string { return fmt.Sprintf(`{__name__="installs_total", job="i", junk="%d"}`, n) }

// A full series budget does not refuse new label sets for series_ttl: series
// pushed once whose value is stored are evicted for them, least recently
// pushed first; series pushed more often stay until they have been idle for
// evict_idle_after. Nothing unflushed is evicted: a full budget of fresh
// series refuses with 429 until the next flush.
func TestPushSeriesBudgetEvictsFlushedSeriesPushedOnce(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = 4
	cfg.RateLimit = RateLimit{RequestsPerSecond: 1e6, Burst: 1e6}
	f := newFixture(t, cfg)
	push := func(body string) (int, string, http.Header) {
		return f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", body)
	}
	for range 2 { // legitimate: two series, pushed twice
		code, body, _ := push(counterText)
		require.Equal(t, http.StatusOK, code, body)
	}
	for i := 1; i <= 2; i++ { // junk fills the budget
		code, body, _ := push(counterPush(fmt.Sprintf(`junk="%d"`, i)))
		require.Equal(t, http.StatusOK, code, body)
	}
	// Nothing is stored yet: nothing can be evicted, until the next flush.
	code, body, hdr := push(counterPush(`platform="azure"`))
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Equal(t, "30", hdr.Get("Retry-After"))
	require.Equal(t, 1.0, testutil.ToFloat64(f.gw.metrics.budgetRefused.WithLabelValues("acme")))
	require.Equal(t, 1.0, testutil.ToFloat64(f.gw.metrics.rejected.WithLabelValues(reasonSeriesLimit)))

	f.state("acme") // flush: the junk is stored, and evictable
	code, body, _ = push(counterPush(`platform="azure"`))
	require.Equal(t, http.StatusOK, code, body)
	want := map[string]float64{
		`{__name__="installs_total", job="i", platform="aws", result="ok"}`:   2,
		`{__name__="installs_total", job="i", platform="gcp", result="fail"}`: 4,
		junk(2): 1,
		`{__name__="installs_total", job="i", platform="azure"}`: 1,
	}
	require.Equal(t, want, f.held("acme"), "the oldest series pushed once went")
	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP phonehome_push_evicted_series_total Aggregated push series evicted, by tenant, to make room for new ones when push.max_series_per_tenant was reached (their last value is in the TSDB).
# TYPE phonehome_push_evicted_series_total counter
phonehome_push_evicted_series_total{tenant="acme"} 1
# HELP phonehome_push_series Aggregated push series held, by tenant (at most push.max_series_per_tenant each).
# TYPE phonehome_push_series gauge
phonehome_push_series{tenant="acme"} 4
`), "phonehome_push_evicted_series_total", "phonehome_push_series"))

	require.Equal(t, 1.0, f.w.get("acme")[junk(1)], "the evicted series' value was stored before it went")

	f.reopen() // the log holds the eviction: replay evicts too
	require.Equal(t, want, f.held("acme"))
	f.state("acme") // after a start, nothing is evictable before the first flush (Run's)

	// More junk evicts series pushed once, never the others (not idle yet).
	code, body, _ = push(counterPush(`junk="3"`, `junk="4"`))
	require.Equal(t, http.StatusOK, code, body)
	f.state("acme")
	code, body, _ = push(counterPush(`junk="5"`, `junk="6"`, `junk="7"`))
	require.Equal(t, http.StatusBadRequest, code, body, "only two can go; nothing fresh will be evictable after a flush either")
	require.Contains(t, f.held("acme"), `{__name__="installs_total", job="i", platform="aws", result="ok"}`)

	// Idle for evict_idle_after: series pushed more often may go too.
	f.now = f.now.Add(time.Duration(cfg.EvictIdleAfter) + time.Minute)
	f.state("acme")
	code, body, _ = push(counterPush(`junk="5"`, `junk="6"`, `junk="7"`))
	require.Equal(t, http.StatusOK, code, body)
	held := f.held("acme")
	require.Len(t, held, 4)
	require.NotContains(t, held, junk(3), "series pushed once go before idle ones")
	require.NotContains(t, held, junk(4))
	require.Equal(t, 5.0, testutil.ToFloat64(f.gw.metrics.evicted.WithLabelValues("acme")))
}

// A histogram is evicted whole, layout included: a new push of it with
// other buckets is accepted.
func TestPushSeriesBudgetEvictsAHistogramWhole(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = 4
	f := newFixture(t, cfg)
	h := "# TYPE install_seconds histogram\ninstall_seconds_bucket{le=\"1\"} 1\ninstall_seconds_bucket{le=\"+Inf\"} 1\ninstall_seconds_sum 0.5\ninstall_seconds_count 1\n"
	code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", h)
	require.Equal(t, http.StatusOK, code, body)
	f.state("acme")
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterPush(`platform="aws"`))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, map[string]float64{`{__name__="installs_total", job="i", platform="aws"}`: 1}, f.held("acme"))
	f.gw.mu.Lock()
	require.Empty(t, f.gw.state["acme"].Layouts)
	f.gw.mu.Unlock()
}

func TestConfigValidateEvictIdleAfter(t *testing.T) {
	cfg := Config{FlushInterval: mustDuration(t, "1m"), EvictIdleAfter: mustDuration(t, "30s")}
	cfg.SetDefaults()
	require.ErrorContains(t, cfg.Validate(), "push.evict_idle_after: 30s is shorter than push.flush_interval (1m)")
	def := Config{}
	def.SetDefaults()
	require.Equal(t, "1d", def.EvictIdleAfter.String())
}

// A push the budget refuses gets 429 only if the next flush makes room for
// it (series pushed once since the last one become evictable then), else
// 400 at once: never a 429 it cannot win followed by a 400.
func TestPushSeriesBudget429OnlyWhenAFlushMakesRoom(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = 4
	cfg.RateLimit = RateLimit{RequestsPerSecond: 1e6, Burst: 1e6}
	f := newFixture(t, cfg)
	push := func(body string) (int, string, http.Header) {
		return f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", body)
	}
	for range 2 { // two established series
		code, body, _ := push(counterText)
		require.Equal(t, http.StatusOK, code, body)
	}
	code, body, _ := push(counterPush(`junk="1"`))
	require.Equal(t, http.StatusOK, code, body)
	f.state("acme") // junk 1 is stored: evictable
	code, body, _ = push(counterPush(`junk="2"`))
	require.Equal(t, http.StatusOK, code, body) // fresh: evictable after the next flush

	code, body, hdr := push(counterPush(`new="1"`, `new="2"`, `new="3"`))
	require.Equal(t, http.StatusBadRequest, code, "junk 1 now and junk 2 after the flush make room for two, not three: %s", body)
	require.Empty(t, hdr.Get("Retry-After"))
	code, body, _ = push(counterPush(`junk="2"`, `new="1"`, `new="2"`))
	require.Equal(t, http.StatusBadRequest, code, "junk 2 is pushed again by this push, so the flush does not make it evictable for it: %s", body)

	code, body, hdr = push(counterPush(`new="1"`, `new="2"`))
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Equal(t, "30", hdr.Get("Retry-After"))
	f.state("acme")
	code, body, _ = push(counterPush(`new="1"`, `new="2"`))
	require.Equal(t, http.StatusOK, code, "the retry after the flush wins: %s", body)
	require.NotContains(t, f.held("acme"), junk(1))
	require.NotContains(t, f.held("acme"), junk(2))
}

// TestPushSeriesBudget429BeforeTheFirstFlush: after a restart nothing is
// evictable until the first flush (it is what tells the TSDB holds the
// series), so a push that needs room then gets 429, not 400: the retry
// after that flush evicts the idle series.
func TestPushSeriesBudget429BeforeTheFirstFlush(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = 2
	cfg.RateLimit = RateLimit{RequestsPerSecond: 1e6, Burst: 1e6}
	f := newFixture(t, cfg)
	for range 2 { // established series
		code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
		require.Equal(t, http.StatusOK, code, body)
	}
	f.state("acme")
	f.now = f.now.Add(48 * time.Hour) // idle for longer than evict_idle_after

	f.reopen() // a restart; no flush yet
	code, body, hdr := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterPush(`new="1"`))
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Equal(t, "30", hdr.Get("Retry-After"))
	f.state("acme")
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterPush(`new="1"`))
	require.Equal(t, http.StatusOK, code, body)
}
