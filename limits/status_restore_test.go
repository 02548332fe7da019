package limits

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// restarted saves l's clusters of tenant acme and restores them into a
// fresh Limiter started after a restart of d.
func restarted(t *testing.T, l *Limiter, clock *fakeClock, d time.Duration, spec Spec) *Limiter {
	t.Helper()
	saved := l.SavedClusters("acme")
	clock.Advance(d)
	l2 := New(nil, Config{Defaults: spec}, clock.Now)
	l2.TrackClusters([]string{"series_limit", "rate_limit", "invalid_labels"})
	require.Equal(t, len(saved), l2.RestoreClusters("acme", saved))
	return l2
}

// A cluster saved by one process shows in the next as it did, silent once
// its last-seen time says so, without a series counted towards a limit.
func TestRestoredClusterShowsAsBeforeAndCountsNoSeries(t *testing.T) {
	spec := Spec{MaxSeriesPerCluster: ptr(3), MaxSeriesPerTenant: ptr(0), MaxSeriesPerMetric: ptr(0), SeriesIdleTimeout: ptr(modelDuration(30 * time.Minute))}
	l, clock := trackedLimiter(t, spec)
	request(t, l, "acme", "c1", hashes(0, 5), 2) // 3 admitted, 2 refused
	seen := clock.Now()
	clock.Advance(time.Hour) // c1 silent, its series expired
	l.Expire()
	request(t, l, "acme", "c2", hashes(100, 2), 1)
	before, ok := l.Cluster("acme", "c1")
	require.True(t, ok)
	require.Zero(t, before.Series)

	l2 := restarted(t, l, clock, 5*time.Minute, spec)
	c1, ok := l2.Cluster("acme", "c1")
	require.True(t, ok)
	require.Equal(t, seen, c1.LastSeen, "last seen before this process started")
	require.Zero(t, c1.Series)
	require.Zero(t, c1.Samples, "samples are this process's")
	require.Equal(t, map[string]uint64{"series_limit": 4}, c1.Refusals())
	proto, client, def := c1.Client()
	require.Equal(t, []string{"prometheus.WriteRequest", "phonehome-forwarder/0.1.0", "v7"}, []string{proto, client, def})
	now := clock.Now()
	require.Equal(t, []int{1, 2, 2}, l2.ClustersSeen("acme", now.Add(-10*time.Minute), now.Add(-2*time.Hour), now.Add(-ClusterRetention)),
		"c2 reports, c1 went silent over an hour before the restart")

	c2, ok := l2.Cluster("acme", "c2")
	require.True(t, ok)
	require.EqualValues(t, 2, c2.Series, "shown as before the restart")
	ts, _ := l2.Tenant("acme")
	require.Zero(t, ts.Series, "nothing restored counts towards a limit")
	for _, err := range request(t, l2, "acme", "c2", hashes(200, 3), 1) {
		require.NoError(t, err, "the 2 restored series do not count")
	}
	for _, err := range request(t, l2, "acme", "c2", hashes(300, 1), 1) {
		require.Error(t, err, "3 series written since the start: c2 is at its limit")
	}
	c2, _ = l2.Cluster("acme", "c2")
	require.EqualValues(t, 3, c2.Series, "written again: its live count")
	require.Equal(t, clock.Now(), c2.LastSeen)
}

// A restored cluster's series count shows until its series would have
// expired in the process that saved it.
func TestRestoredSeriesCountShowsUntilIdleTimeout(t *testing.T) {
	spec := Spec{SeriesIdleTimeout: ptr(modelDuration(30 * time.Minute))}
	l, clock := trackedLimiter(t, spec)
	request(t, l, "acme", "c1", hashes(0, 4), 1)
	l2 := restarted(t, l, clock, 10*time.Minute, spec)
	c1, _ := l2.Cluster("acme", "c1")
	require.EqualValues(t, 4, c1.Series)
	clock.Advance(21 * time.Minute)
	c1, _ = l2.Cluster("acme", "c1")
	require.Zero(t, c1.Series)
	require.Empty(t, l2.SavedClusters("acme")[0].Series, "and is saved as such")
}

// A restored cluster that does not write again is collected
// ClusterRetention after it was last seen, as one silent in-process.
func TestRestoredClusterExpiresAfterRetention(t *testing.T) {
	l, clock := trackedLimiter(t, unlimitedSeries())
	request(t, l, "acme", "c1", hashes(0, 2), 1)
	l2 := restarted(t, l, clock, time.Hour, unlimitedSeries())
	clock.Advance(ClusterRetention - time.Hour)
	l2.Expire()
	_, ok := l2.Cluster("acme", "c1")
	require.True(t, ok, "kept for ClusterRetention")
	clock.Advance(time.Second)
	l2.Expire()
	_, ok = l2.Cluster("acme", "c1")
	require.False(t, ok, "collected")
	require.Empty(t, l2.Clusters("acme"))
	require.Equal(t, []int{0}, l2.ClustersSeen("acme", time.Time{}))
}

// What is not restored: a cluster last seen longer ago than
// ClusterRetention, and one that wrote in this process before the restore
// (its own state is newer). Nothing restores without tracking.
func TestRestoreSkips(t *testing.T) {
	l, clock := trackedLimiter(t, unlimitedSeries())
	now := clock.Now()
	request(t, l, "acme", "live", hashes(0, 1), 1)
	n := l.RestoreClusters("acme", []SavedCluster{
		{ID: "old", LastSeen: now.Add(-ClusterRetention)},
		{ID: "live", LastSeen: now.Add(-time.Hour), Series: 9},
		{ID: "future", LastSeen: now.Add(time.Hour)},
		{ID: "", LastSeen: now},
	})
	require.Equal(t, 1, n)
	_, ok := l.Cluster("acme", "old")
	require.False(t, ok)
	live, _ := l.Cluster("acme", "live")
	require.Equal(t, now, live.LastSeen)
	require.EqualValues(t, 1, live.Series)
	future, _ := l.Cluster("acme", "future")
	require.Equal(t, now, future.LastSeen, "a clock that went back: seen now")

	off := New(nil, Config{Defaults: unlimitedSeries()}, clock.Now)
	require.Zero(t, off.RestoreClusters("acme", []SavedCluster{{ID: "c", LastSeen: now}}))
	require.Empty(t, off.Tenants())
}

// The restored series count fills padding: a clusterStat stays in the
// 48-byte size class the README's per-cluster cost is measured with.
func TestClusterStatSize(t *testing.T) {
	require.EqualValues(t, 48, unsafe.Sizeof(clusterStat{}))
}
