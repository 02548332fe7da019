package limits

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

func TestForgetDropsTheCluster(t *testing.T) {
	spec := unlimitedSeries()
	spec.MaxSeriesPerCluster = ptr(5)
	spec.SamplesPerSecondPerCluster = ptr(10.0)
	spec.BurstPerCluster = ptr(100)
	l, _ := trackedLimiter(t, spec)
	reg := prometheus.NewRegistry()
	l.m = newMetrics(reg, l)

	// "gone": 5 series (its limit) over two metric names, a refused sixth,
	// and a rate bucket it has drawn from; "kept": 3 series and a refusal.
	s := l.Session("acme", "gone")
	for i, h := range hashes(0, 5) {
		require.NoError(t, s.Admit(fmt.Sprintf("m%d", i%2), h))
	}
	require.Error(t, s.Admit("m0", hashes(5, 1)[0]))
	s.Refuse("series_limit", 1, func() string { return `{_id="gone"}` })
	s.Done("prometheus.WriteRequest", "forwarder")
	_, err := l.AllowSamples("acme", "gone", 50)
	require.NoError(t, err)
	request(t, l, "acme", "kept", hashes(100, 3), 1)
	l.Refused("acme", "kept", "rate_limit", 7)
	require.EqualValues(t, 8, gauge(t, reg, "phonehome_limits_tracked_series"))

	series, known := l.Forget("acme", "gone")
	require.Equal(t, 5, series)
	require.True(t, known)

	// Its series budget is free, the tenant's and metric names' counts
	// hold only "kept"'s series, and the status page does not list it.
	require.EqualValues(t, 3, gauge(t, reg, "phonehome_limits_tracked_series"))
	ts, _ := l.Tenant("acme")
	require.EqualValues(t, 3, ts.Series)
	tn := l.tenant("acme")
	tn.mu.RLock()
	_, _, interned := tn.clusters.get("gone")
	_, m1, _ := tn.metrics.get("m1")
	_, up, _ := tn.metrics.get("up")
	tn.mu.RUnlock()
	require.False(t, interned)
	require.Zero(t, m1.n.Load())
	require.EqualValues(t, 3, up.n.Load())
	_, ok := l.Cluster("acme", "gone")
	require.False(t, ok)
	var listed []string
	for _, c := range l.Clusters("acme") {
		listed = append(listed, c.ID)
	}
	require.Equal(t, []string{"kept"}, listed)
	require.Empty(t, l.RecentRefusals("acme", "gone"))
	require.Len(t, l.RecentRefusals("acme", ""), 1) // kept's rate limit
	tn.rateMu.Lock()
	_, bucket := tn.clusterRates["gone"]
	tn.rateMu.Unlock()
	require.False(t, bucket)
	require.Equal(t, []int{1}, l.ClustersSeen("acme", time.Time{}))

	// Admitted again (re-admission), it starts from nothing.
	request(t, l, "acme", "gone", hashes(0, 5), 1)
	c, ok := l.Cluster("acme", "gone")
	require.True(t, ok)
	require.EqualValues(t, 5, c.Series)
	require.EqualValues(t, 5, c.Samples)
	require.Zero(t, c.Refused)

	series, known = l.Forget("acme", "never-seen")
	require.Zero(t, series)
	require.False(t, known)
	series, known = l.Forget("nobody", "gone")
	require.Zero(t, series)
	require.False(t, known)
}

// Forget while the cluster and others write, Expire collects and the
// status page reads: the counts stay equal to what the shards hold. Run
// with -race.
func TestForgetUnderConcurrentAdmission(t *testing.T) {
	clk := newClock()
	cfg := Config{Defaults: Spec{
		MaxSeriesPerCluster: ptr(150),
		MaxSeriesPerTenant:  ptr(0),
		MaxSeriesPerMetric:  ptr(0),
		SeriesIdleTimeout:   ptr(modelDuration(time.Minute)),
	}}
	l := New(prometheus.NewRegistry(), cfg, clk.Now)
	l.TrackClusters([]string{"series_limit"})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for round := range 40 {
				s := l.Session("t", fmt.Sprintf("c%d", w))
				admitRound(&s, w, round)
				s.Done("", "")
			}
		})
	}
	wg.Go(func() { // the erasures, and the receiver's periodic work
		for round := range 60 {
			l.Forget("t", fmt.Sprintf("c%d", round%4))
			clk.Advance(10 * time.Second)
			l.Expire()
			_ = l.Clusters("t")
		}
	})
	wg.Wait()

	requireCountsMatchShards(t, l, "t")

	// Once the writes have stopped, a forget leaves nothing of a cluster.
	for w := range 4 {
		l.Forget("t", fmt.Sprintf("c%d", w))
	}
	require.Zero(t, l.tracked.Load())
	require.Empty(t, l.Clusters("t"))
	require.Empty(t, l.RecentRefusals("t", ""))
}
