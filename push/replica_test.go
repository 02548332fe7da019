package push

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestPushReplicaPartialsSumExactly spreads pushes round-robin over three
// gateways, as replicas behind a load balancer receive them: each writes its
// partial sums with its own push_replica, so no two replicas write the same
// series, and the sum over push_replica is exactly what was pushed.
func TestPushReplicaPartialsSumExactly(t *testing.T) {
	replicas := []*fixture{}
	for _, r := range []string{"r0", "r1", "r2"} {
		f := &fixture{t: t, replica: r, dir: t.TempDir(), cfg: testConfig(), w: &fakeWriter{}, now: time.Unix(1_800_000_000, 0)}
		f.open()
		replicas = append(replicas, f)
	}
	const pushes = 7
	for i := range pushes {
		code, body, _ := replicas[i%3].push(http.MethodPost, "/metrics/job/installer/version/4.2", "tok-a", "", counterText)
		require.Equal(t, http.StatusOK, code, body)
	}
	total := map[string]float64{}
	seen := map[string]bool{}
	for _, f := range replicas {
		for series, v := range f.state("acme") {
			require.False(t, seen[series], "two replicas wrote %s", series)
			seen[series] = true
			want := `, push_replica="` + f.replica + `"`
			require.Contains(t, series, want)
			total[strings.Replace(series, want, "", 1)] += v
		}
	}
	require.Equal(t, map[string]float64{
		`{__name__="installs_total", job="installer", platform="aws", result="ok", version="4.2"}`:   pushes,
		`{__name__="installs_total", job="installer", platform="gcp", result="fail", version="4.2"}`: 2 * pushes,
	}, total)

	// A restart keeps each replica's partial sums and label.
	replicas[1].reopen()
	st := replicas[1].state("acme")
	require.Equal(t, 2.0, st[`{__name__="installs_total", job="installer", platform="aws", push_replica="r1", result="ok", version="4.2"}`])
}

func TestPushWithoutReplicaAddsNoLabel(t *testing.T) {
	f := newFixture(t, testConfig())
	code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusOK, code, body)
	for series := range f.state("acme") {
		require.NotContains(t, series, ReplicaLabel)
	}
}

func TestWithReplicaKeepsLabelsSorted(t *testing.T) {
	for _, names := range [][]string{{}, {"__name__"}, {"__name__", "zone"}, {"a", "push_replica", "z"}, {"__name__", "job", "platform"}} {
		pl := labelsOf(names...)
		got := withReplica(pl, "r1")
		n := 0
		for i, l := range got {
			if i > 0 {
				require.Less(t, got[i-1].Name, l.Name, "%v", got)
			}
			if l.Name == ReplicaLabel {
				require.Equal(t, "r1", l.Value)
				n++
			}
		}
		require.Equal(t, 1, n, "%v", got)
	}
}

// TestPushSeriesExpire: a series no push has touched for series_ttl leaves
// the state, is counted, stays gone after a restart, and starts again from
// zero when pushed anew; histogram layouts expire with their series.
func TestPushSeriesExpire(t *testing.T) {
	cfg := testConfig()
	cfg.SeriesTTL = mustDuration(t, "1h")
	f := newFixture(t, cfg)
	const hist = "# TYPE install_seconds histogram\ninstall_seconds_bucket{le=\"1\"} 1\ninstall_seconds_bucket{le=\"+Inf\"} 2\ninstall_seconds_sum 3\ninstall_seconds_count 2\n"
	const a, b = "# TYPE installs_total counter\ninstalls_total{p=\"a\"} 1\n", "# TYPE installs_total counter\ninstalls_total{p=\"b\"} 1\n"
	push := func(body string) {
		t.Helper()
		code, resp, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", body)
		require.Equal(t, http.StatusOK, code, resp)
	}
	push(a)
	push(hist)
	f.now = f.now.Add(30 * time.Minute)
	push(b)
	f.now = f.now.Add(30*time.Minute + time.Second) // a and hist: 1h1s; b: 30m1s
	f.w = &fakeWriter{}
	f.gw.w = f.w
	require.Equal(t, map[string]float64{`{__name__="installs_total", job="i", p="b"}`: 1}, f.state("acme"))
	require.Equal(t, 5.0, testutil.ToFloat64(f.gw.metrics.expiredSeries)) // a, two buckets, sum, count
	require.Equal(t, 1, f.gw.seriesCount())

	f.reopen() // the snapshot was rewritten: nothing comes back
	require.Equal(t, map[string]float64{`{__name__="installs_total", job="i", p="b"}`: 1}, f.state("acme"))

	// Pushed anew: from zero, and a histogram may come with other buckets.
	push(a)
	push(strings.ReplaceAll(hist, `le="1"`, `le="2"`))
	st := f.state("acme")
	require.Equal(t, 1.0, st[`{__name__="installs_total", job="i", p="a"}`])
	require.Equal(t, 1.0, st[`{__name__="install_seconds_bucket", job="i", le="2"}`])

	// Everything expires: the tenant goes.
	f.now = f.now.Add(2 * time.Hour)
	f.gw.Flush(t.Context())
	require.Equal(t, 0, f.gw.seriesCount())
	f.gw.mu.Lock()
	require.Empty(t, f.gw.state)
	f.gw.mu.Unlock()
}

// TestPushExpiryOfOlderState: a snapshot and log records written before
// series carried their last push time count as pushed at the restart.
func TestPushExpiryOfOlderState(t *testing.T) {
	cfg := testConfig()
	cfg.SeriesTTL = mustDuration(t, "1h")
	f := newFixture(t, cfg)
	f.close()
	snap := `{"seq":1,"tenants":{"acme":{"types":{"installs_total":"counter"},"layouts":{},"series":[{"labels":{"__name__":"installs_total","job":"i","p":"old"},"value":4}]}}}`
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, snapshotFile), []byte(snap), 0o600))
	rec := record{Seq: 2, Tenant: "acme", Types: map[string]string{"installs_total": "counter"}, Samples: []delta{{Labels: labelsFromMap(map[string]string{"__name__": "installs_total", "job": "i", "p": "logged"}), Value: 2}}}
	payload, err := json.Marshal(rec)
	require.NoError(t, err)
	require.NotContains(t, string(payload), `"time"`)
	l := &durableLog{dir: f.dir}
	l.f, err = os.OpenFile(filepath.Join(f.dir, logFile), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	require.NoError(t, err)
	require.NoError(t, l.append(&rec))
	require.NoError(t, l.close())

	f.now = f.now.Add(24 * time.Hour) // the restart, long after both were written
	f.open()
	f.now = f.now.Add(59 * time.Minute)
	require.Len(t, f.state("acme"), 2)
	f.now = f.now.Add(2 * time.Minute)
	f.w = &fakeWriter{}
	f.gw.w = f.w
	require.Empty(t, f.state("acme"))
	require.Equal(t, 2.0, testutil.ToFloat64(f.gw.metrics.expiredSeries))
}

// labelsOf makes labels with the given names (values "v").
func labelsOf(names ...string) []prompb.Label {
	out := make([]prompb.Label, 0, len(names))
	for _, n := range names {
		out = append(out, prompb.Label{Name: n, Value: "v"})
	}
	return out
}

func mustDuration(t *testing.T, s string) model.Duration {
	t.Helper()
	d, err := model.ParseDuration(s)
	require.NoError(t, err)
	return d
}
