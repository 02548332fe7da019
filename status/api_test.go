package status

import (
	"encoding/json"
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

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fixture: tenant acme with clusters c000..c049 (c0xx has xx+1 series),
// one of them refused; tenant other with one cluster.
func fixture(t *testing.T) (*Status, *limits.Limiter, *clock) {
	t.Helper()
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	zero, ten := 0, 10
	l := limits.New(nil, limits.Config{Defaults: limits.Spec{MaxSeriesPerCluster: &ten, MaxSeriesPerTenant: &zero, MaxSeriesPerMetric: &zero}}, clk.now)
	l.TrackClusters([]string{"series_limit", "rate_limit"})
	write := func(tenant, cluster string, series int) {
		s := l.Session(tenant, cluster)
		for i := range series {
			if err := s.Admit("up", uint64(len(cluster))<<56^uint64(i)<<20^hash(tenant+cluster)); err != nil {
				s.Refuse("series_limit", 1, func() string { return fmt.Sprintf(`{__name__="up", _id=%q, i="%d"}`, cluster, i) })
				continue
			}
			s.Accept(1)
		}
		s.Done("prometheus.WriteRequest", "phonehome-forwarder/0.1.0")
	}
	for i := range 50 {
		write("acme", fmt.Sprintf("c%03d", i), i%10+1)
		clk.add(time.Second)
	}
	write("acme", "noisy", 15) // 5 over its limit
	write("other", "theirs", 3)
	s := New(slog.New(slog.DiscardHandler), nil, Options{Limiter: l, Now: clk.now})
	s.Record()
	return s, l, clk
}

func hash(s string) uint64 {
	var h uint64 = 14695981039346656037
	for i := range len(s) {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

type answer struct {
	code int
	body struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
}

func get(t *testing.T, s *Status, id *auth.Identity, url string) answer {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, url, nil)
	if id != nil {
		r = r.WithContext(auth.WithIdentity(r.Context(), *id))
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, r)
	var a answer
	a.code = rec.Code
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &a.body), rec.Body.String())
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	return a
}

type page struct {
	Total, Matched, Offset, Limit int
	Clusters                      []clusterJSON
}

func ids(p page) []string {
	var out []string
	for _, c := range p.Clusters {
		out = append(out, c.ID)
	}
	return out
}

var (
	reader = &auth.Identity{Tenant: "acme", Allow: auth.PermRead}
	admin  = &auth.Identity{Tenant: "ops", Allow: auth.PermFleetStatus}
	writer = &auth.Identity{Tenant: "acme", ClusterID: "c001", Allow: auth.PermWrite}
)

func TestClustersPagingSortingSearch(t *testing.T) {
	s, _, _ := fixture(t)
	for _, tc := range []struct {
		name  string
		url   string
		want  []string
		match int
	}{
		{"first page by id", "/api/v1/status/clusters?limit=3", []string{"c000", "c001", "c002"}, 51},
		{"second page", "/api/v1/status/clusters?limit=3&offset=3", []string{"c003", "c004", "c005"}, 51},
		{"past the end", "/api/v1/status/clusters?offset=100", nil, 51},
		{"last page is short", "/api/v1/status/clusters?limit=20&offset=40", []string{"c040", "c041", "c042", "c043", "c044", "c045", "c046", "c047", "c048", "c049", "noisy"}, 51},
		{"prefix search", "/api/v1/status/clusters?q=c01", []string{"c010", "c011", "c012", "c013", "c014", "c015", "c016", "c017", "c018", "c019"}, 10},
		{"no match", "/api/v1/status/clusters?q=zzz", nil, 0},
		{"by series, most first; ties by id", "/api/v1/status/clusters?sort=series&order=desc&limit=4", []string{"c009", "c019", "c029", "c039"}, 51},
		{"by refusals", "/api/v1/status/clusters?sort=refused&order=desc&limit=1", []string{"noisy"}, 51},
		{"by last seen, newest first", "/api/v1/status/clusters?sort=last_seen&order=desc&limit=2", []string{"noisy", "c049"}, 51},
		{"by samples/s", "/api/v1/status/clusters?sort=samples_per_second&limit=1", []string{"c000"}, 51},
		{"by state", "/api/v1/status/clusters?state=silent", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := get(t, s, reader, tc.url)
			require.Equal(t, 200, a.code, a.body.Error)
			var p page
			require.NoError(t, json.Unmarshal(a.body.Data, &p))
			require.Equal(t, tc.want, ids(p))
			require.Equal(t, tc.match, p.Matched)
			require.Equal(t, 51, p.Total)
		})
	}

	a := get(t, s, reader, "/api/v1/status/clusters?q=noisy")
	var p page
	require.NoError(t, json.Unmarshal(a.body.Data, &p))
	c := p.Clusters[0]
	require.EqualValues(t, 10, c.Series)
	require.Equal(t, 10, c.SeriesLimit)
	require.Equal(t, map[string]uint64{"series_limit": 5}, c.Refused)
	require.Equal(t, "1.0", c.Protocol)
	require.Equal(t, "0.1.0", c.ForwarderVersion)
	require.Equal(t, "reporting", c.State)
}

func TestBadParameters(t *testing.T) {
	s, _, _ := fixture(t)
	for _, url := range []string{
		"/api/v1/status/clusters?limit=0",
		"/api/v1/status/clusters?limit=1001",
		"/api/v1/status/clusters?limit=x",
		"/api/v1/status/clusters?offset=-1",
		"/api/v1/status/clusters?sort=name",
		"/api/v1/status/clusters?order=up",
		"/api/v1/status/clusters?state=asleep",
		"/api/v1/status/clusters?bogus=1",
		"/api/v1/status/clusters?q=" + strings.Repeat("x", 300),
		"/api/v1/status/overview?silent_intervals=0",
		"/api/v1/status/overview?silent_intervals=abc",
		"/api/v1/status/history?hours=25",
		"/api/v1/status/clusters/c001?hours=0",
	} {
		t.Run(url, func(t *testing.T) {
			a := get(t, s, reader, url)
			require.Equal(t, 400, a.code)
			require.Equal(t, "bad_data", a.body.ErrorType)
		})
	}
	a := get(t, s, admin, "/api/v1/status/overview?tenant=..")
	require.Equal(t, 400, a.code)
	a = get(t, s, reader, "/api/v1/status/clusters/nope")
	require.Equal(t, 404, a.code)
}

func TestTenantIsolation(t *testing.T) {
	s, _, _ := fixture(t)
	other := &auth.Identity{Tenant: "other", Allow: auth.PermRead}

	a := get(t, s, other, "/api/v1/status/clusters")
	var p page
	require.NoError(t, json.Unmarshal(a.body.Data, &p))
	require.Equal(t, []string{"theirs"}, ids(p))

	for _, url := range []string{"/api/v1/status/clusters/c001", "/api/v1/status/clusters/noisy"} {
		require.Equal(t, 404, get(t, s, other, url).code, "another tenant's cluster does not exist for it")
	}
	for _, url := range []string{"/api/v1/status/clusters?tenant=acme", "/api/v1/status/overview?tenant=acme", "/api/v1/status/clusters/c001?tenant=acme"} {
		a := get(t, s, other, url)
		require.Equal(t, 403, a.code, url)
	}
	// A cluster credential may write, not read the fleet.
	require.Equal(t, 403, get(t, s, writer, "/api/v1/status/overview").code)

	// A tenant's admin credential stays in its tenant (as in the erasure
	// API); fleet_status reads any tenant, and lists them.
	tenantAdmin := &auth.Identity{Tenant: "other", Allow: auth.PermAdmin}
	require.Equal(t, 403, get(t, s, tenantAdmin, "/api/v1/status/clusters?tenant=acme").code)
	require.Equal(t, 200, get(t, s, tenantAdmin, "/api/v1/status/clusters").code)
	a = get(t, s, tenantAdmin, "/api/v1/status/tenants")
	var own struct{ Tenants []string }
	require.NoError(t, json.Unmarshal(a.body.Data, &own))
	require.Equal(t, []string{"other"}, own.Tenants)
	a = get(t, s, admin, "/api/v1/status/clusters?tenant=acme&limit=1")
	require.Equal(t, 200, a.code)
	require.NoError(t, json.Unmarshal(a.body.Data, &p))
	require.Equal(t, 51, p.Total)
	a = get(t, s, admin, "/api/v1/status/tenants")
	var tl struct{ Tenants []string }
	require.NoError(t, json.Unmarshal(a.body.Data, &tl))
	require.Equal(t, []string{"acme", "ops", "other"}, tl.Tenants)
	a = get(t, s, reader, "/api/v1/status/tenants")
	require.NoError(t, json.Unmarshal(a.body.Data, &tl))
	require.Equal(t, []string{"acme"}, tl.Tenants)
}

func TestOverviewAndHistory(t *testing.T) {
	s, l, clk := fixture(t)
	clk.add(time.Minute)
	l.Refused("acme", "c003", "rate_limit", 40)
	s.Record()

	a := get(t, s, reader, "/api/v1/status/overview")
	require.Equal(t, 200, a.code, a.body.Error)
	var o struct {
		Clusters         map[string]figure
		Series           figure
		RefusedLastHour  map[string]uint64 `json:"refused_last_hour"`
		SamplesPerSecond figure            `json:"samples_per_second"`
		Gathering        struct {
			ClustersByVersion map[string]int `json:"clusters_by_version"`
		}
		Clients map[string]int
	}
	require.NoError(t, json.Unmarshal(a.body.Data, &o))
	require.EqualValues(t, 51, o.Clusters["reporting"].Value)
	require.EqualValues(t, 51, o.Clusters["last_24h"].Value)
	require.Zero(t, o.Clusters["silent"].Value)
	require.NotEmpty(t, o.Clusters["reporting"].Source.PromQL)
	require.EqualValues(t, 5*55+10, o.Series.Value) // 1..10 five times, plus noisy's 10
	require.Equal(t, map[string]uint64{"series_limit": 5, "rate_limit": 40}, o.RefusedLastHour)
	require.Equal(t, map[string]int{"phonehome-forwarder/0.1.0": 51}, o.Clients)
	require.Equal(t, map[string]int{"": 51}, o.Gathering.ClustersByVersion)

	// An hour later nothing was refused in the last hour; the clusters went silent.
	for range 61 {
		clk.add(time.Minute)
		s.Record()
	}
	a = get(t, s, reader, "/api/v1/status/overview")
	o.RefusedLastHour = nil // Unmarshal merges into a map
	require.NoError(t, json.Unmarshal(a.body.Data, &o))
	require.Empty(t, o.RefusedLastHour)
	require.EqualValues(t, 51, o.Clusters["silent"].Value)
	require.EqualValues(t, 0, o.Clusters["reporting"].Value)

	a = get(t, s, reader, "/api/v1/status/history?hours=2")
	require.Equal(t, 200, a.code)
	var h seriesJSON
	require.NoError(t, json.Unmarshal(a.body.Data, &h))
	require.Len(t, h.Time, 62)
	require.InDelta(t, 40.0/60, h.RefusedPerSecond["rate_limit"][0], 1e-9)
	require.Equal(t, 51, h.Reporting[0])
	require.Equal(t, 0, h.Reporting[len(h.Reporting)-1])
}

func TestClusterDetail(t *testing.T) {
	s, _, _ := fixture(t)
	a := get(t, s, reader, "/api/v1/status/clusters/noisy")
	require.Equal(t, 200, a.code, a.body.Error)
	var d struct {
		Cluster        clusterJSON
		RecentRefusals []struct {
			Reason  string
			Samples int
			Example string
		} `json:"recent_refusals"`
		Sources map[string]source
	}
	require.NoError(t, json.Unmarshal(a.body.Data, &d))
	require.Equal(t, "noisy", d.Cluster.ID)
	require.Len(t, d.RecentRefusals, 1)
	require.Equal(t, "series_limit", d.RecentRefusals[0].Reason)
	require.Equal(t, 5, d.RecentRefusals[0].Samples)
	require.Equal(t, `{__name__="up", _id="noisy", i="10"}`, d.RecentRefusals[0].Example)
	require.Equal(t, `count({_id="noisy"})`, d.Sources["series"].PromQL)
}

// TestSamplesPerSecondPartial: before the first RateWindow has closed
// the samples/s are over the part elapsed, marked partial in the overview,
// the clusters table and a cluster's page, with PromQL over that span; not
// a 0 that reads as "nothing arrives".
func TestSamplesPerSecondPartial(t *testing.T) {
	s, l, clk := fixture(t) // 50 s of writes: 285 samples of acme, 1 of c000
	var o struct {
		SamplesPerSecond figure `json:"samples_per_second"`
	}
	a := get(t, s, reader, "/api/v1/status/overview")
	require.NoError(t, json.Unmarshal(a.body.Data, &o))
	require.Equal(t, figure{Value: 285.0 / 60, Limit: 1e6, WindowSeconds: 60, Partial: true,
		Source: source{PromQL: `sum(count_over_time({__name__=~".+"}[1m])) / 60`}}, o.SamplesPerSecond, "at least RateMinSpan")

	clk.add(4 * time.Minute)
	a = get(t, s, reader, "/api/v1/status/clusters?q=c000")
	var p page
	require.NoError(t, json.Unmarshal(a.body.Data, &p))
	require.InDelta(t, 1.0/290, p.Clusters[0].SamplesPerSecond, 1e-6)
	require.Equal(t, 290.0, p.Clusters[0].RateWindow)
	require.True(t, p.Clusters[0].RatePartial)
	var d struct {
		Cluster clusterJSON
		Sources map[string]source
	}
	a = get(t, s, reader, "/api/v1/status/clusters/c000")
	require.NoError(t, json.Unmarshal(a.body.Data, &d))
	require.True(t, d.Cluster.RatePartial)
	require.Equal(t, `sum(count_over_time({_id="c000"}[290s])) / 290`, d.Sources["samples_per_second"].PromQL)

	clk.add(limits.RateWindow - 4*time.Minute)
	l.Expire() // the first window closes, 10m50s after tracking began
	a = get(t, s, reader, "/api/v1/status/overview")
	o.SamplesPerSecond = figure{} // partial is left out when false
	require.NoError(t, json.Unmarshal(a.body.Data, &o))
	require.InDelta(t, 285.0/650, o.SamplesPerSecond.Value, 1e-9)
	require.Equal(t, 600.0, o.SamplesPerSecond.WindowSeconds)
	require.False(t, o.SamplesPerSecond.Partial)
	require.Equal(t, `sum(count_over_time({__name__=~".+"}[10m])) / 600`, o.SamplesPerSecond.Source.PromQL)
	a = get(t, s, reader, "/api/v1/status/clusters/c000")
	require.NoError(t, json.Unmarshal(a.body.Data, &d))
	require.False(t, d.Cluster.RatePartial)
	require.Equal(t, 600.0, d.Cluster.RateWindow)
}

func TestTopK(t *testing.T) {
	xs := []int{9, 3, 7, 1, 8, 2, 6, 4, 5, 0, 11, 10, 13, 12, 15, 14, 17, 16, 19, 18}
	cmpInt := func(a, b int) int { return a - b }
	for k := 0; k <= len(xs); k++ {
		got := topK(append([]int(nil), xs...), k, cmpInt)
		want := make([]int, k)
		for i := range want {
			want[i] = i
		}
		require.Equal(t, want, got, "k=%d", k)
	}
}

func TestPageHeaders(t *testing.T) {
	s, _, _ := fixture(t)
	for _, url := range []string{"/", "/status/static/app.js", "/status/static/style.css"} {
		rec := httptest.NewRecorder()
		s.UI().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, url, nil))
		require.Equal(t, 200, rec.Code, url)
		require.Contains(t, rec.Header().Get("Content-Security-Policy"), "script-src 'self'")
		require.Equal(t, "DENY", rec.Header().Get("X-Frame-Options"))
	}
	rec := httptest.NewRecorder()
	s.UI().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	require.NotContains(t, rec.Body.String(), "<script>", "no inline script")
	require.Contains(t, rec.Body.String(), `<label for="token">`)
}

// TestHistorySurvivesRestart: the charts and the refusals of the last hour
// carry over a restart through the history file; no rate is drawn across
// the restart, where the counters began again at 0.
func TestHistorySurvivesRestart(t *testing.T) {
	s, l, clk := fixture(t)
	file := filepath.Join(t.TempDir(), "status", "history.json")
	s.opts.HistoryFile = file
	clk.add(time.Minute)
	l.Refused("acme", "c003", "rate_limit", 40)
	s.Record()
	require.NoError(t, s.save())

	// The next process: its limiter's counters start at 0.
	clk.add(time.Minute)
	l2 := limits.New(nil, limits.Config{}, clk.now)
	l2.TrackClusters([]string{"series_limit", "rate_limit"})
	l2.Refused("acme", "c003", "rate_limit", 7)
	s2 := New(slog.New(slog.DiscardHandler), nil, Options{Limiter: l2, Now: clk.now, HistoryFile: file})
	s2.Record()
	clk.add(time.Minute)
	s2.Record()

	a := get(t, s2, reader, "/api/v1/status/overview")
	require.Equal(t, 200, a.code, a.body.Error)
	var o struct {
		RefusedLastHour map[string]uint64 `json:"refused_last_hour"`
	}
	require.NoError(t, json.Unmarshal(a.body.Data, &o))
	require.Equal(t, map[string]uint64{"series_limit": 5, "rate_limit": 47}, o.RefusedLastHour)

	a = get(t, s2, reader, "/api/v1/status/history?hours=2")
	require.Equal(t, 200, a.code, a.body.Error)
	var h seriesJSON
	require.NoError(t, json.Unmarshal(a.body.Data, &h))
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Add(50 * time.Second) // the fixture's first point
	require.Equal(t, []int64{start.Add(time.Minute).Unix(), start.Add(3 * time.Minute).Unix()}, h.Time,
		"one rate before the restart, none across it, one after")
	require.InDelta(t, 40.0/60, h.RefusedPerSecond["rate_limit"][0], 1e-9)
	require.Zero(t, h.RefusedPerSecond["rate_limit"][1])
	require.Equal(t, 51, h.Reporting[0])
}

// TestHistoryFileUnreadable: a damaged history file leaves the charts
// empty; the status page still starts.
func TestHistoryFileUnreadable(t *testing.T) {
	_, l, clk := fixture(t)
	file := filepath.Join(t.TempDir(), "history.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"version":1,"tenants":{"acme":[{"t":`), 0o600))
	var logs strings.Builder
	s := New(slog.New(slog.NewTextHandler(&logs, nil)), nil, Options{Limiter: l, Now: clk.now, HistoryFile: file})
	require.Contains(t, logs.String(), "status page history not loaded")
	require.Empty(t, s.history)
}

// TestHistoryWrittenEveryTenMinutes: a crash loses at most saveInterval of
// the charts (README): the minute ticks write the file once it has passed.
func TestHistoryWrittenEveryTenMinutes(t *testing.T) {
	s, _, clk := fixture(t)
	s.opts.HistoryFile = filepath.Join(t.TempDir(), "history.json")
	last := clk.now()
	for range 9 {
		clk.add(time.Minute)
		last = s.tick(last)
	}
	_, err := os.Stat(s.opts.HistoryFile)
	require.ErrorIs(t, err, os.ErrNotExist, "written before 10 minutes")
	clk.add(time.Minute)
	require.Equal(t, clk.now(), s.tick(last))
	b, err := os.ReadFile(s.opts.HistoryFile)
	require.NoError(t, err)
	require.Contains(t, string(b), `"acme"`)
}
