package limits

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// unlimitedSeries is a Spec with every series limit off, to test one at a time.
func unlimitedSeries() Spec {
	return Spec{MaxSeriesPerCluster: ptr(0), MaxSeriesPerTenant: ptr(0), MaxSeriesPerMetric: ptr(0)}
}

func rejected(t *testing.T, reg *prometheus.Registry, limit string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "phonehome_limits_rejected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == limit {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no rejected counter for %s", limit)
	return 0
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// admitSeries is a one-off Session(tenant, cluster).Admit(metric, hash).
func admitSeries(l *Limiter, tenant, cluster, metric string, hash uint64) error {
	s := l.Session(tenant, cluster)
	return s.Admit(metric, hash)
}

func TestMetricsPreCreated(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg, Config{}, nil)
	require.Equal(t, len(limitNames()), testutil.CollectAndCount(reg, "phonehome_limits_rejected_total"))
	require.Equal(t, 1, testutil.CollectAndCount(reg, "phonehome_limits_tracked_series"))
	require.Equal(t, 1, testutil.CollectAndCount(reg, "phonehome_limits_expired_series_total"))
	for _, name := range limitNames() {
		require.NotNil(t, (&LimitError{Limit: name}).Unwrap(), name)
	}
}

func TestSeriesLimits(t *testing.T) {
	const limit = 5
	cases := []struct {
		limit string
		set   func(*Spec)
		// series i of the fill; all hit the limit under test and no other.
		series func(i int) (cluster, metric string)
		// other is a new series not subject to the full limit.
		other func() (cluster, metric string)
	}{
		{
			limit:  LimitSeriesPerCluster,
			set:    func(s *Spec) { s.MaxSeriesPerCluster = ptr(limit) },
			series: func(i int) (string, string) { return "c1", fmt.Sprintf("m%d", i) },
			other:  func() (string, string) { return "c2", "m0" },
		},
		{
			limit:  LimitSeriesPerTenant,
			set:    func(s *Spec) { s.MaxSeriesPerTenant = ptr(limit) },
			series: func(i int) (string, string) { return fmt.Sprintf("c%d", i), fmt.Sprintf("m%d", i) },
			other:  nil, // the whole tenant is full
		},
		{
			limit:  LimitSeriesPerMetric,
			set:    func(s *Spec) { s.MaxSeriesPerMetric = ptr(limit) },
			series: func(i int) (string, string) { return fmt.Sprintf("c%d", i), "up" },
			other:  func() (string, string) { return "c0", "other" },
		},
	}
	for _, tc := range cases {
		for _, fill := range []int{limit - 2, limit - 1, limit} {
			name := map[int]string{limit - 2: "under", limit - 1: "just under", limit: "at"}[fill]
			t.Run(tc.limit+"/"+name, func(t *testing.T) {
				spec := unlimitedSeries()
				tc.set(&spec)
				reg := prometheus.NewRegistry()
				l := New(reg, Config{Defaults: spec}, newClock().Now)
				for i := range fill {
					c, m := tc.series(i)
					require.NoError(t, admitSeries(l, "t", c, m, uint64(i+1)))
				}
				c, m := tc.series(fill)
				err := admitSeries(l, "t", c, m, uint64(fill+1))
				if fill < limit {
					require.NoError(t, err)
					require.Equal(t, 0.0, rejected(t, reg, tc.limit))
					return
				}
				var le *LimitError
				require.ErrorAs(t, err, &le)
				require.Equal(t, LimitError{Limit: tc.limit, Value: limit}, *le)
				require.ErrorIs(t, err, ErrSeriesLimit)
				require.Equal(t, tc.limit+" limit of 5 reached", err.Error())
				require.Equal(t, 1.0, rejected(t, reg, tc.limit))
				require.Equal(t, float64(limit), gauge(t, reg, "phonehome_limits_tracked_series"))

				// Existing series keep flowing while the limit is reached.
				for i := range fill {
					c, m := tc.series(i)
					require.NoError(t, admitSeries(l, "t", c, m, uint64(i+1)))
				}
				if tc.other != nil {
					c, m := tc.other()
					require.NoError(t, admitSeries(l, "t", c, m, 1000), "a series outside the full scope passes")
				}
				require.NoError(t, admitSeries(l, "other-tenant", c, m, uint64(fill+1)), "tenants are independent")
			})
		}
	}
}

// Over: a reload lowers the limit below the tracked count.
func TestSeriesLimitLoweredBelowCount(t *testing.T) {
	l := New(nil, Config{Defaults: Spec{MaxSeriesPerCluster: ptr(5)}}, newClock().Now)
	for i := range 5 {
		require.NoError(t, admitSeries(l, "t", "c", "m", uint64(i+1)))
	}
	l.Reload(Config{Defaults: Spec{MaxSeriesPerCluster: ptr(3)}})
	require.Equal(t, 3, l.For("t").MaxSeriesPerCluster)
	for i := range 5 {
		require.NoError(t, admitSeries(l, "t", "c", "m", uint64(i+1)), "existing series %d still passes", i)
	}
	require.ErrorIs(t, admitSeries(l, "t", "c", "m", 100), ErrSeriesLimit)
}

func TestSeriesHotReload(t *testing.T) {
	cfg := func(perCluster int) Config {
		return Config{Tenants: map[string]Spec{"acme": {MaxSeriesPerCluster: ptr(perCluster)}}}
	}
	l := New(nil, cfg(3), newClock().Now)
	s := l.Session("acme", "c")
	for i := range 3 {
		require.NoError(t, s.Admit("m", uint64(i+1)))
	}
	require.Error(t, s.Admit("m", 4))

	// Lower: existing pass, new refused.
	l.Reload(cfg(2))
	s = l.Session("acme", "c")
	for i := range 3 {
		require.NoError(t, s.Admit("m", uint64(i+1)))
	}
	err := s.Admit("m", 4)
	require.Equal(t, "max_series_per_cluster limit of 2 reached", err.Error())

	// Raise: admitted at once, no restart, nothing forgotten.
	l.Reload(cfg(5))
	s = l.Session("acme", "c")
	require.NoError(t, s.Admit("m", 4))
	require.NoError(t, s.Admit("m", 5))
	require.ErrorIs(t, s.Admit("m", 6), ErrSeriesLimit)
	require.Equal(t, int64(5), l.tracked.Load())

	// Removing the override falls back to the defaults (10000).
	l.Reload(Config{})
	require.NoError(t, admitSeries(l, "acme", "c", "m", 6))
}

func TestSeriesIdleExpiryFreesSlot(t *testing.T) {
	clk := newClock()
	reg := prometheus.NewRegistry()
	l := New(reg, Config{Defaults: Spec{
		MaxSeriesPerCluster: ptr(2),
		SeriesIdleTimeout:   ptr(modelDuration(30 * time.Minute)),
	}}, clk.Now)

	require.NoError(t, admitSeries(l, "t", "c", "m", 1))
	clk.Advance(10 * time.Minute)
	require.NoError(t, admitSeries(l, "t", "c", "m", 2))
	require.ErrorIs(t, admitSeries(l, "t", "c", "m", 3), ErrSeriesLimit)

	clk.Advance(20 * time.Minute) // series 1 idle exactly 30m: still counts
	require.Equal(t, 0, l.Expire())
	require.ErrorIs(t, admitSeries(l, "t", "c", "m", 3), ErrSeriesLimit)

	clk.Advance(time.Second) // now idle longer than 30m
	require.Equal(t, 1, l.Expire())
	require.Equal(t, 1.0, gauge(t, reg, "phonehome_limits_expired_series_total"))
	require.Equal(t, 1.0, gauge(t, reg, "phonehome_limits_tracked_series"))
	require.NoError(t, admitSeries(l, "t", "c", "m", 3), "the slot is free")
	require.ErrorIs(t, admitSeries(l, "t", "c", "m", 1), ErrSeriesLimit, "series 1 is new again, and the cluster is full")

	// A write refreshes last-seen.
	clk.Advance(29 * time.Minute)
	require.NoError(t, admitSeries(l, "t", "c", "m", 2)) // refreshes series 2
	clk.Advance(29 * time.Minute)
	require.Equal(t, 1, l.Expire(), "series 3 (58m idle) goes, series 2 (29m idle) stays")
	require.NoError(t, admitSeries(l, "t", "c", "m", 2))

	// Everything idle: names and counts are collected.
	clk.Advance(time.Hour)
	require.Equal(t, 1, l.Expire())
	tn := l.tenant("t")
	require.Zero(t, tn.series.Load())
	require.Empty(t, tn.clusters.ids)
	require.Empty(t, tn.metrics.ids)
	require.NoError(t, admitSeries(l, "t", "c", "m", 9), "a collected cluster comes back")
	require.Equal(t, int64(1), tn.series.Load())
}

// A session that cached a cluster survives the cluster being collected.
func TestSessionSurvivesCollection(t *testing.T) {
	clk := newClock()
	l := New(nil, Config{}, clk.Now)
	s := l.Session("t", "c")
	require.NoError(t, s.Admit("m", 1))
	clk.Advance(2 * time.Hour)
	require.Equal(t, 1, l.Expire())
	require.True(t, s.cs.dead)
	require.NoError(t, s.Admit("m", 2))
	tn := l.tenant("t")
	_, cs, ok := tn.clusters.get("c")
	require.True(t, ok)
	require.Equal(t, int64(1), cs.n.Load())
}

func TestSeriesLimitExactUnderConcurrency(t *testing.T) {
	const limit, workers, each = 100, 8, 50
	l := New(nil, Config{Defaults: Spec{MaxSeriesPerCluster: ptr(limit)}}, newClock().Now)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
	)
	for w := range workers {
		wg.Go(func() {
			s := l.Session("t", "c")
			n := 0
			for i := range each {
				err := s.Admit("m", uint64(w*each+i+1)*0x9E3779B97F4A7C15)
				if err == nil {
					n++
				} else if !errors.Is(err, ErrSeriesLimit) {
					panic(err)
				}
			}
			mu.Lock()
			admitted += n
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Equal(t, limit, admitted)
	require.Equal(t, int64(limit), l.tracked.Load())
}

// Stress: writers, Expire, Reload and rate checks at once; run with -race.
// The invariants: counts equal what the shards hold, and never exceed limits.
func TestConcurrentStress(t *testing.T) {
	clk := newClock()
	const clusterLimit, tenantLimit = 300, 1000
	cfg := Config{Defaults: Spec{
		MaxSeriesPerCluster: ptr(clusterLimit),
		MaxSeriesPerTenant:  ptr(tenantLimit),
		MaxSeriesPerMetric:  ptr(0),
		SeriesIdleTimeout:   ptr(modelDuration(time.Minute)),
	}}
	l := New(prometheus.NewRegistry(), cfg, clk.Now)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 6 {
		wg.Go(func() {
			for round := range 30 {
				s := l.Session("t", fmt.Sprintf("c%d", w))
				admitRound(&s, w, round)
				_, _ = l.AllowSamples("t", fmt.Sprintf("c%d", w), 100)
			}
		})
	}
	expirerDone := make(chan struct{})
	go func() { // expirer: moves the clock, expires and reloads while writers run
		defer close(expirerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			clk.Advance(20 * time.Second)
			l.Expire()
			l.Reload(cfg)
		}
	}()
	wg.Wait()
	close(stop)
	<-expirerDone

	inShards, perCluster := requireCountsMatchShards(t, l, "t")
	require.LessOrEqual(t, inShards, int64(tenantLimit))
	for _, n := range perCluster {
		require.LessOrEqual(t, n, int64(clusterLimit))
	}
}

// admitRound admits writer w's 200 series of round (a third of them new
// each round) over 7 metric names, recording the refusals. It panics on
// anything but a series limit: it runs in a goroutine.
func admitRound(s *Session, w, round int) {
	for i := range 200 {
		h := uint64(w)<<40 | uint64(round%3)<<20 | uint64(i)
		err := s.Admit(fmt.Sprintf("m%d", i%7), h*0x9E3779B97F4A7C15)
		if err != nil && !errors.Is(err, ErrSeriesLimit) {
			panic(err)
		}
		if err != nil {
			s.Refuse("series_limit", 1, nil)
		}
	}
}

// requireCountsMatchShards checks that the tenant's, the limiter's, every
// cluster's and every metric name's counts equal the series the shards
// hold, and that no series refers to a collected name. It returns the
// series and the series per cluster id.
func requireCountsMatchShards(t *testing.T, l *Limiter, tenant string) (int64, map[uint32]int64) {
	t.Helper()
	tn := l.tenant(tenant)
	var inShards int64
	perCluster, perMetric := map[uint32]int64{}, map[uint32]int64{}
	for i := range tn.shards {
		for _, sl := range tn.shards[i].m.slots {
			if !sl.free() {
				inShards++
				perCluster[sl.entry().cluster]++
				perMetric[sl.entry().metric]++
			}
		}
	}
	require.Equal(t, inShards, tn.series.Load())
	require.Equal(t, inShards, l.tracked.Load())
	for _, in := range []struct {
		names *interner
		held  map[uint32]int64
	}{{&tn.clusters, perCluster}, {&tn.metrics, perMetric}} {
		for id, c := range in.names.byID {
			if c != nil {
				require.Equal(t, in.held[uint32(id)], c.n.Load(), c.name)
			}
		}
		for id := range in.held {
			require.NotNil(t, in.names.byID[id], "a series of a collected name")
		}
	}
	return inShards, perCluster
}

// A shard that empties out gives its slots back.
func TestExpireRebuildsEmptiedShard(t *testing.T) {
	clk := newClock()
	l := New(nil, unlimited(), clk.Now)
	s := l.Session("t", "c")
	for i := range 2000 { // small hashes: all in shard 0
		require.NoError(t, s.Admit("m", uint64(i+1)))
	}
	sh := &l.tenant("t").shards[0]
	require.GreaterOrEqual(t, len(sh.m.slots), 2500)
	clk.Advance(time.Hour)
	s = l.Session("t", "c")
	for i := range 100 {
		require.NoError(t, s.Admit("m", uint64(i+1)))
	}
	require.Equal(t, 1900, l.Expire())
	require.Less(t, len(sh.m.slots), 200, "rebuilt at its new size")
	require.Equal(t, 100, sh.m.len())
	for i := range 100 {
		require.NoError(t, s.Admit("m", uint64(i+1)))
	}
	require.Equal(t, int64(100), l.tracked.Load())
}

// The hint kept with a series (the receiver's head reference) comes back
// with every admission of it, does not touch the counts, and goes with the
// series when it expires.
func TestAdmitKeyHint(t *testing.T) {
	clk := newClock()
	l := New(nil, unlimited(), clk.Now)
	s := l.Session("t", "c")
	k1, k2 := Key{1, 1 << 60}, Key{2, 1 << 60} // same shard, distinct keys
	h, err := s.AdmitKey("m", k1)
	require.NoError(t, err)
	require.Zero(t, h, "a new series has no hint")
	l.SetHint("t", k1, 42)
	l.SetHint("t", k2, 43) // not tracked: nothing happens
	h, err = s.AdmitKey("m", k1)
	require.NoError(t, err)
	require.EqualValues(t, 42, h)
	h, err = s.AdmitKey("m", k2)
	require.NoError(t, err)
	require.Zero(t, h)
	require.Equal(t, int64(2), l.tracked.Load())
	require.Equal(t, int64(2), l.tenant("t").series.Load())
	// Admit's 64-bit hash is the seeded half of a key: the same series.
	require.NoError(t, s.Admit("m", 1<<60))
	h, err = s.AdmitKey("m", Key{0, 1 << 60})
	require.NoError(t, err)
	require.Zero(t, h)
	require.Equal(t, int64(3), l.tracked.Load())

	clk.Advance(time.Hour)
	require.Equal(t, 3, l.Expire())
	s = l.Session("t", "c")
	h, err = s.AdmitKey("m", k1)
	require.NoError(t, err)
	require.Zero(t, h, "the hint expired with the series")
}

// The per-cluster and per-tenant limits count keys exactly as they counted
// hashes.
func TestAdmitKeyLimits(t *testing.T) {
	clk := newClock()
	one, two := 1, 2
	l := New(nil, Config{Defaults: Spec{MaxSeriesPerCluster: &one, MaxSeriesPerTenant: &two}}, clk.Now)
	a := l.Session("t", "a")
	_, err := a.AdmitKey("m", Key{1, 1})
	require.NoError(t, err)
	_, err = a.AdmitKey("m", Key{1, 1}) // the same series again
	require.NoError(t, err)
	_, err = a.AdmitKey("m", Key{2, 1}) // another series: over the cluster's limit
	var le *LimitError
	require.ErrorAs(t, err, &le)
	require.Equal(t, LimitSeriesPerCluster, le.Limit)
	b := l.Session("t", "b")
	_, err = b.AdmitKey("m", Key{3, 3})
	require.NoError(t, err)
	c := l.Session("t", "c")
	_, err = c.AdmitKey("m", Key{4, 4})
	require.ErrorAs(t, err, &le)
	require.Equal(t, LimitSeriesPerTenant, le.Limit)
}
