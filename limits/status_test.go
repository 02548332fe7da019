package limits

import (
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func trackedLimiter(t *testing.T, spec Spec) (*Limiter, *fakeClock) {
	t.Helper()
	clock := newClock()
	l := New(nil, Config{Defaults: spec}, clock.Now)
	l.TrackClusters([]string{"series_limit", "rate_limit", "invalid_labels"})
	return l, clock
}

// request admits series of one cluster as the receiver does for one request.
func request(t *testing.T, l *Limiter, tenant, cluster string, series []uint64, samples int) []error {
	t.Helper()
	s := l.Session(tenant, cluster)
	var errs []error
	for _, h := range series {
		err := s.Admit("up", h)
		if err != nil {
			s.Refuse("series_limit", samples, func() string { return fmt.Sprintf(`{__name__="up", h="%d"}`, h) })
		} else {
			s.Accept(samples)
		}
		errs = append(errs, err)
	}
	s.Definition("v7")
	s.Done("prometheus.WriteRequest", "phonehome-forwarder/0.1.0")
	return errs
}

func hashes(from, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = uint64(from+i) * 0x9e3779b97f4a7c15
	}
	return hs
}

func TestTrackingOff(t *testing.T) {
	l := New(nil, Config{Defaults: unlimitedSeries()}, newClock().Now)
	request(t, l, "acme", "c1", hashes(0, 3), 1)
	l.Refused("acme", "c1", "rate_limit", 10)
	require.False(t, l.Tracking())
	require.Nil(t, l.Clusters("acme"))
	require.Nil(t, l.RecentRefusals("acme", ""))
	_, ok := l.Cluster("acme", "c1")
	require.False(t, ok)
	ts, ok := l.Tenant("acme")
	require.True(t, ok)
	require.EqualValues(t, 3, ts.Series)
	require.Zero(t, ts.Samples)
}

func TestTrackClusters(t *testing.T) {
	l, clock := trackedLimiter(t, Spec{MaxSeriesPerCluster: ptr(4), MaxSeriesPerTenant: ptr(0), MaxSeriesPerMetric: ptr(0)})
	start := clock.Now()
	require.Empty(t, request(t, l, "acme", "c1", hashes(0, 2), 3)[0:0])
	clock.Advance(90 * time.Second)
	errs := request(t, l, "acme", "c2", hashes(100, 6), 2) // 2 over the cluster limit
	require.NoError(t, errs[3])
	require.Error(t, errs[4])
	require.Error(t, errs[5])
	l.Refused("acme", "c2", "rate_limit", 50)
	l.Refused("acme", "c2", "no_such_reason", 1)

	c1, ok := l.Cluster("acme", "c1")
	require.True(t, ok)
	require.Equal(t, start, c1.LastSeen)
	require.EqualValues(t, 2, c1.Series)
	require.EqualValues(t, 6, c1.Samples)
	require.Zero(t, c1.Refused)
	proto, client, def := c1.Client()
	require.Equal(t, []string{"prometheus.WriteRequest", "phonehome-forwarder/0.1.0", "v7"}, []string{proto, client, def})

	c2, ok := l.Cluster("acme", "c2")
	require.True(t, ok)
	require.Equal(t, start.Add(90*time.Second), c2.LastSeen)
	require.EqualValues(t, 4, c2.Series)
	require.EqualValues(t, 8, c2.Samples)
	require.Equal(t, map[string]uint64{"series_limit": 4, "rate_limit": 50, "other": 1}, c2.Refusals())
	require.EqualValues(t, 55, c2.Refused)

	all := l.Clusters("acme")
	require.Len(t, all, 2)
	ts, ok := l.Tenant("acme")
	require.True(t, ok)
	require.EqualValues(t, 6, ts.Series)
	require.EqualValues(t, 14, ts.Samples)
	require.Equal(t, map[string]uint64{"series_limit": 4, "rate_limit": 50, "other": 1}, ts.Refused)
	require.Equal(t, 4, ts.Limits.MaxSeriesPerCluster)

	// One ring entry per request, cluster and reason; the example is the
	// first refused series'.
	recent := l.RecentRefusals("acme", "c2")
	require.Len(t, recent, 3)
	require.Equal(t, "other", recent[0].Reason)
	require.Equal(t, "rate_limit", recent[1].Reason)
	require.Empty(t, recent[1].Example)
	require.Equal(t, "series_limit", recent[2].Reason)
	require.Equal(t, 4, recent[2].Count)
	require.Equal(t, fmt.Sprintf(`{__name__="up", h="%d"}`, hashes(104, 1)[0]), recent[2].Example)
	require.Empty(t, l.RecentRefusals("acme", "c1"))
	require.Len(t, l.RecentRefusals("acme", ""), 3)
	require.Empty(t, l.Clusters("other-tenant"))
	require.Equal(t, []string{"acme"}, l.Tenants())

	// Rates: the samples since the last roll (tracking started 90s before
	// c2's request), rolled once at least RateWindow has passed; partial
	// until then (TestPartialRate).
	clock.Advance(RateWindow - 91*time.Second)
	l.Expire()
	c2, _ = l.Cluster("acme", "c2")
	require.Equal(t, Rate{Value: 8 / 599.0, Span: 599 * time.Second, Partial: true}, c2.Rate, "no window completed yet")
	clock.Advance(time.Second)
	l.Expire()
	window := RateWindow.Seconds()
	c2, _ = l.Cluster("acme", "c2")
	require.InDelta(t, 8/window, c2.Rate.Value, 1e-6)
	require.False(t, c2.Rate.Partial)
	ts, _ = l.Tenant("acme")
	require.InDelta(t, 14/window, ts.Rate.Value, 1e-6)
	clock.Advance(RateWindow)
	l.Expire()
	c2, _ = l.Cluster("acme", "c2")
	require.Equal(t, Rate{Span: RateWindow}, c2.Rate)
}

// Until the first window of a cluster or tenant completes, after a start
// or for one that appeared since the last roll, its rate is over the part
// of the window elapsed (at least RateMinSpan), marked partial; never a 0
// that reads as "nothing arrives".
func TestPartialRate(t *testing.T) {
	require.Equal(t, time.Minute, RateMinSpan, "README: a partial rate is over at least 1 minute")
	require.Equal(t, 10*time.Minute, RateWindow, "README: the 10-minute window")
	l, clock := trackedLimiter(t, unlimitedSeries())
	partial := func(samples float64, span time.Duration) Rate {
		return Rate{Value: samples / span.Seconds(), Span: span, Partial: true}
	}
	completed := Rate{Value: 6 / RateWindow.Seconds(), Span: RateWindow}
	// Clusters' completed rates are float32.
	rounded := func(r Rate) Rate { r.Value = float64(float32(r.Value)); return r }
	cluster := func(tenant, id string) Rate {
		t.Helper()
		c, ok := l.Cluster(tenant, id)
		require.True(t, ok)
		return rounded(c.Rate)
	}
	tenant := func(name string) Rate {
		t.Helper()
		ts, _ := l.Tenant(name)
		return ts.Rate
	}

	request(t, l, "acme", "c1", hashes(0, 6), 1)
	require.Equal(t, rounded(partial(6, RateMinSpan)), cluster("acme", "c1"), "one request is spread over RateMinSpan")
	require.Equal(t, partial(6, RateMinSpan), tenant("acme"))

	clock.Advance(3 * time.Minute)
	l.Expire()
	require.Equal(t, rounded(partial(6, 3*time.Minute)), cluster("acme", "c1"))
	require.Equal(t, partial(6, 3*time.Minute), tenant("acme"))

	clock.Advance(RateWindow - 3*time.Minute)
	l.Expire() // the first window closes
	require.Equal(t, rounded(completed), cluster("acme", "c1"))
	require.Equal(t, completed, tenant("acme"))

	// A cluster and a tenant new since that roll.
	clock.Advance(2 * time.Minute)
	request(t, l, "acme", "c2", hashes(100, 12), 1)
	request(t, l, "late", "c3", hashes(200, 3), 1)
	require.Equal(t, rounded(partial(12, 2*time.Minute)), cluster("acme", "c2"))
	require.Equal(t, rounded(partial(3, 2*time.Minute)), cluster("late", "c3"))
	require.Equal(t, partial(3, 2*time.Minute), tenant("late"))
	require.Equal(t, completed, tenant("acme"), "the last completed window")
	require.Len(t, l.Clusters("acme"), 2)
	for _, c := range l.Clusters("acme") {
		require.Equal(t, c.ID == "c2", c.Rate.Partial, c.ID)
	}
}

// A cluster whose series expired is listed as silent until
// ClusterRetention, then forgotten.
func TestTrackedClusterRetention(t *testing.T) {
	l, clock := trackedLimiter(t, unlimitedSeries())
	request(t, l, "acme", "gone", hashes(0, 3), 1)
	clock.Advance(time.Hour) // past the 30m idle timeout
	require.Equal(t, 3, l.Expire())
	c, ok := l.Cluster("acme", "gone")
	require.True(t, ok)
	require.Zero(t, c.Series)
	require.EqualValues(t, 3, c.Samples)

	clock.Advance(ClusterRetention - time.Hour)
	l.Expire()
	_, ok = l.Cluster("acme", "gone")
	require.True(t, ok, "kept until ClusterRetention has passed")
	clock.Advance(2 * time.Second)
	l.Expire()
	_, ok = l.Cluster("acme", "gone")
	require.False(t, ok)
	require.Empty(t, l.Clusters("acme"))
}

// A cluster refused every series (its tenant is full) is still listed.
func TestTrackedRefusedOnly(t *testing.T) {
	l, _ := trackedLimiter(t, Spec{MaxSeriesPerCluster: ptr(0), MaxSeriesPerTenant: ptr(1), MaxSeriesPerMetric: ptr(0)})
	request(t, l, "acme", "first", hashes(0, 1), 1)
	request(t, l, "acme", "late", hashes(10, 2), 1)
	c, ok := l.Cluster("acme", "late")
	require.True(t, ok)
	require.Zero(t, c.Series)
	require.Equal(t, map[string]uint64{"series_limit": 2}, c.Refusals())
	require.False(t, c.LastSeen.IsZero())
}

// No cluster label: tenant totals only.
func TestTrackedNoCluster(t *testing.T) {
	l, _ := trackedLimiter(t, unlimitedSeries())
	request(t, l, "acme", "", hashes(0, 2), 5)
	require.Empty(t, l.Clusters("acme"))
	ts, _ := l.Tenant("acme")
	require.EqualValues(t, 10, ts.Samples)
}

func TestTrackerNamesBounded(t *testing.T) {
	tr := &tracker{ids: map[string]uint16{}}
	for i := range maxNames {
		require.EqualValues(t, i+1, tr.id(fmt.Sprint(i)))
	}
	require.EqualValues(t, maxNames+1, tr.id("one too many"))
	require.Equal(t, "other", tr.name(tr.id("one too many")))
	require.Equal(t, "7", tr.name(tr.id("7")))
	require.Zero(t, tr.id(""))
}

// Concurrent writers, expiry and snapshots (run with -race).
func TestTrackingConcurrent(t *testing.T) {
	l, clock := trackedLimiter(t, Spec{MaxSeriesPerCluster: ptr(50), MaxSeriesPerTenant: ptr(0), MaxSeriesPerMetric: ptr(0)})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				request(t, l, "acme", fmt.Sprintf("c%d", (w*200+i)%37), hashes(i, 60), 1)
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			clock.Advance(time.Minute)
			l.Expire()
			for _, c := range l.Clusters("acme") {
				c.Refusals()
				c.Client()
			}
			l.RecentRefusals("acme", "")
		}
	})
	wg.Wait()
	require.Len(t, l.Clusters("acme"), 37)
}

func TestClustersSeen(t *testing.T) {
	l, clock := trackedLimiter(t, unlimitedSeries())
	t0 := clock.Now()
	request(t, l, "acme", "a", hashes(0, 1), 1)
	clock.Advance(time.Hour)
	request(t, l, "acme", "b", hashes(10, 1), 1)
	now := clock.Now()
	require.Equal(t, []int{2, 1, 0}, l.ClustersSeen("acme", t0.Add(-time.Hour), now, now.Add(time.Second)))
	require.Equal(t, []int{0}, l.ClustersSeen("nobody", t0))
}

// The README's 47 B per tracked cluster is a 48-byte clusterStat (a size
// class of Go's allocator) and its pointer: a field more must not push it
// into the next class (64 B) unnoticed.
func TestClusterStatFitsItsSizeClass(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(clusterStat{}), uintptr(48))
}
