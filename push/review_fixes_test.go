package push

import (
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
)

// TestPushRefusesAnOverflowingAggregate: two finite pushes whose sum is not
// finite: the second is refused (400), the aggregate keeps the first, and
// snapshots and erasures of every tenant go on working.
func TestPushRefusesAnOverflowingAggregate(t *testing.T) {
	f := newFixture(t, testConfig())
	body := "# TYPE installs_total counter\ninstalls_total 1.7e308\n"
	code, b, _ := f.push(http.MethodPost, "/metrics/job/x", "tok-b", "", body)
	require.Equal(t, http.StatusOK, code, b)
	code, b, _ = f.push(http.MethodPost, "/metrics/job/x", "tok-b", "", body)
	require.Equal(t, http.StatusBadRequest, code, b)
	require.Contains(t, b, "would overflow")

	code, b, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-c1", "", counterText)
	require.Equal(t, http.StatusOK, code, b)
	require.Equal(t, 1.7e308, f.state("other")[`{__name__="installs_total", job="x"}`])
	_, err := os.Stat(filepath.Join(f.dir, snapshotFile))
	require.NoError(t, err, "the flush compacted the log into a snapshot")
	n, err := f.gw.Erase("acme", []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", "c1")})
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

// TestPushSnapshotKeepsNonFiniteAggregates: a state from before the
// overflow check may hold +Inf; it is snapshotted and replayed as it is
// rather than stopping compaction (and erasure) for every tenant.
func TestPushSnapshotKeepsNonFiniteAggregates(t *testing.T) {
	f := newFixture(t, testConfig())
	code, b, _ := f.push(http.MethodPost, "/metrics/job/x", "tok-b", "", "# TYPE installs_total counter\ninstalls_total 1\n")
	require.Equal(t, http.StatusOK, code, b)
	f.gw.mu.Lock()
	for _, it := range f.gw.state["other"].Series {
		it.Value = math.Inf(1)
	}
	f.gw.mu.Unlock()
	f.state("other") // flush and compact
	f.reopen()
	require.True(t, math.IsInf(f.state("other")[`{__name__="installs_total", job="x"}`], 1))
}

// TestEraseDropsTheClusterFromHistogramLayouts: a histogram's bucket layout
// is keyed by its labels, _id included: erasing the cluster drops it from
// memory and from the snapshot, and the re-admitted cluster may push other
// buckets.
func TestEraseDropsTheClusterFromHistogramLayouts(t *testing.T) {
	f := newFixture(t, testConfig())
	h := "# TYPE install_seconds histogram\ninstall_seconds_bucket{le=\"1\"} 1\ninstall_seconds_bucket{le=\"+Inf\"} 1\ninstall_seconds_sum 0.5\ninstall_seconds_count 1\n"
	code, b, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-c1", "", h)
	require.Equal(t, http.StatusOK, code, b)
	code, b, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-c2", "", h)
	require.Equal(t, http.StatusOK, code, b)
	n, err := f.gw.Erase("acme", []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", "c1")})
	require.NoError(t, err)
	require.Equal(t, 4, n)
	snap, err := os.ReadFile(filepath.Join(f.dir, snapshotFile))
	require.NoError(t, err)
	require.NotContains(t, string(snap), `"c1"`)
	require.Contains(t, string(snap), `"c2"`, "the other cluster's histogram and layout stay")
	f.gw.mu.Lock()
	require.Len(t, f.gw.state["acme"].Layouts, 1)
	f.gw.mu.Unlock()

	other := "# TYPE install_seconds histogram\ninstall_seconds_bucket{le=\"5\"} 1\ninstall_seconds_bucket{le=\"+Inf\"} 1\ninstall_seconds_sum 0.5\ninstall_seconds_count 1\n"
	code, b, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-c1", "", other)
	require.Equal(t, http.StatusOK, code, b)
}

// TestPushLogRefusesARecordReplayWouldCut: replay takes a record over
// maxRecord for a torn tail and cuts it and everything after it, so none is
// written (413); the log goes on.
func TestPushLogRefusesARecordReplayWouldCut(t *testing.T) {
	f := newFixture(t, testConfig())
	big := &record{Tenant: "acme", Types: map[string]string{strings.Repeat("x", maxRecord): "counter"}}
	f.gw.mu.Lock()
	_, err := f.gw.appendLocked(big)
	f.gw.mu.Unlock()
	require.ErrorIs(t, err, errTooLarge)
	code, b, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-c1", "", counterText)
	require.Equal(t, http.StatusOK, code, b)
	f.reopen()
	require.Len(t, f.state("acme"), 2)
}
