package limits

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Series tracking.
//
// Each tenant has numShards shards, chosen by the top bits of the seeded
// half of the series key, each a mutex and a seriesTable of entries (last
// seen in seconds since the Limiter started, interned cluster and metric ids,
// and the caller's hint: the receiver keeps the series' TSDB head reference
// there, so one table serves the limits and the write path's reference
// cache). A tracked series costs a 36-byte slot at 64–80 % load (table.go);
// BENCHMARKS.md has the measured figure.
//
// Counts (per cluster, per metric name, per tenant) are atomics. A new series
// increments each count only if it stays within its limit, and undoes the
// increments if a later one fails, so a count never exceeds its limit. Two
// concurrent admissions near a limit may both be refused where one would have
// fit (an increment is visible for a moment before it is undone); none is
// ever admitted over a limit.
//
// Tracking is exact for the key: two distinct series whose keys collide
// count once. A Key is 128 bits (Admit's 64-bit hash fills one half): with n
// tracked series of a tenant the expected number of colliding pairs is about
// n²/2^129 (n²/2^65 for 64-bit hashes, 3e-6 at 10M series), so the count is
// exact in practice, and a hint (a head reference) never reaches the wrong
// series. The key must cover every label, including the cluster label, so
// the same key never arrives from two clusters.
//
// Locks: tenant.mu (RW) guards the interners. A new series takes tenant.mu
// for reading, then one shard mutex; Expire does the same per shard, and takes
// tenant.mu for writing only to garbage-collect names. An existing series
// takes only its shard mutex.

const (
	shardBits = 8
	numShards = 1 << shardBits
)

// Key identifies a series within a tenant: two independent 64-bit hashes of
// all its labels, the second seeded so that no client can craft collisions
// (it also picks the shard).
type Key [2]uint64

type entry struct {
	seen    uint32 // seconds since Limiter.epoch
	cluster uint32 // id in tenant.clusters
	metric  uint32 // id in tenant.metrics
	hint    uint64 // the caller's, for this series (SetHint); 0 = none
}

type shard struct {
	mu sync.Mutex
	m  seriesTable
	_  [64 - 8 - 24 - 8]byte // one shard per cache line
}

// counted is an interned name with its number of tracked series.
type counted struct {
	n    atomic.Int64
	name string
	dead bool                        // removed from the interner; guarded by tenant.mu
	stat atomic.Pointer[clusterStat] // clusters only, with TrackClusters (status.go)
}

// interner maps names to small ids. Guarded by tenant.mu.
type interner struct {
	ids  map[string]uint32
	byID []*counted // nil where free
	free []uint32
}

func (in *interner) get(name string) (uint32, *counted, bool) {
	id, ok := in.ids[name]
	if !ok {
		return 0, nil, false
	}
	return id, in.byID[id], true
}

func (in *interner) add(name string) (uint32, *counted) {
	if id, c, ok := in.get(name); ok {
		return id, c
	}
	c := &counted{name: strings.Clone(name)}
	var id uint32
	if n := len(in.free); n > 0 {
		id = in.free[n-1]
		in.free = in.free[:n-1]
		in.byID[id] = c
	} else {
		id = uint32(len(in.byID))
		in.byID = append(in.byID, c)
	}
	in.ids[c.name] = id
	return id, c
}

// gc forgets names without series. tenant.mu must be held for writing, so no
// admission is between looking a name up and counting a series on it.
func (in *interner) gc() { in.gcKeep(nil) }

// gcKeep is gc, sparing names without series for which keep is true.
func (in *interner) gcKeep(keep func(*counted) bool) {
	for id, c := range in.byID {
		if c != nil && c.n.Load() == 0 && (keep == nil || !keep(c)) {
			c.dead = true
			delete(in.ids, c.name)
			in.byID[id] = nil
			in.free = append(in.free, uint32(id))
		}
	}
}

type tenant struct {
	name   string
	series atomic.Int64

	mu       sync.RWMutex
	clusters interner
	metrics  interner

	shards [numShards]shard

	rateMu       sync.Mutex
	rate         *bucket
	clusterRates map[string]*bucket

	inflightMu sync.Mutex
	inflight   map[string]int // cluster → write requests in flight; no zero entries

	tstat atomic.Pointer[tenantStat] // with TrackClusters (status.go)
}

func newTenant(name string) *tenant {
	t := &tenant{
		name:         name,
		clusters:     interner{ids: map[string]uint32{}},
		metrics:      interner{ids: map[string]uint32{}},
		clusterRates: map[string]*bucket{},
		inflight:     map[string]int{},
	}
	return t
}

// acquire returns the counted states of cluster and metric with t.mu held for
// reading. cs is reused if still live.
func (t *tenant) acquire(cid uint32, cs *counted, cluster, metric string) (uint32, *counted, uint32, *counted) {
	for {
		t.mu.RLock()
		if cs == nil || cs.dead {
			cid, cs, _ = t.clusters.get(cluster)
		}
		mid, ms, ok := t.metrics.get(metric)
		if cs != nil && ok {
			return cid, cs, mid, ms
		}
		t.mu.RUnlock()
		t.mu.Lock()
		if cs == nil || cs.dead {
			cid, cs = t.clusters.add(cluster)
		}
		if !ok {
			t.metrics.add(metric)
		}
		t.mu.Unlock()
		// Loop: an Expire between Unlock and RLock may have collected the
		// names just added (they have no series yet).
	}
}

func (t *tenant) expire(now, idle uint32) int {
	var n int
	for i := range t.shards {
		sh := &t.shards[i]
		t.mu.RLock()
		sh.mu.Lock()
		n += sh.m.deleteWhere(func(e entry) bool {
			if now > e.seen && now-e.seen > idle {
				t.clusters.byID[e.cluster].n.Add(-1)
				t.metrics.byID[e.metric].n.Add(-1)
				return true
			}
			return false
		})
		sh.mu.Unlock()
		t.mu.RUnlock()
	}
	t.series.Add(-int64(n))
	t.mu.Lock()
	retention := uint32(ClusterRetention / time.Second)
	t.clusters.gcKeep(func(c *counted) bool { return keepCluster(c, now, retention) })
	t.metrics.gc()
	t.mu.Unlock()
	return n
}

// Session admits the series of one request: one tenant, one cluster. It
// reads the configuration and the clock once, and caches the cluster's
// state, so each Admit costs one shard lock and one map lookup for a known
// series. A Session is cheap (no allocation); make one per request and do not
// share it between goroutines. A Reload applies from the next Session.
type Session struct {
	l       *Limiter
	t       *tenant
	lim     *TenantLimits
	cluster string
	now     uint32
	cid     uint32
	cs      *counted
	errs    [3]*LimitError // reused refusals: cluster, tenant, metric

	// Cluster tracking (status.go).
	samples  int64        // admitted, not yet published by Done
	def      string       // gathering-definition version seen
	reported uint64       // reasons already in the ring, by index
	st       *clusterStat // the cluster's, once looked up
}

// Session starts admitting series of cluster in tenant.
func (l *Limiter) Session(tenant, cluster string) Session {
	return Session{
		l:       l,
		t:       l.tenant(tenant),
		lim:     l.cfg.Load().forTenant(tenant),
		cluster: cluster,
		now:     l.seconds(l.now()),
	}
}

// Admit decides whether the series with the given hash (of all its labels,
// seeded, e.g. labelhash.Seeded) and metric name may be written. It is
// AdmitKey with the hash as the seeded half of the key; a tenant's series
// must all be admitted one way or the other.
func (s *Session) Admit(metric string, hash uint64) error {
	_, err := s.AdmitKey(metric, Key{0, hash})
	return err
}

// AdmitKey decides whether the series with key k and metric name may be
// written, and returns the hint last stored for it with SetHint (0 for a
// new series, or none).
//
// A tracked series always passes and its last-seen time is refreshed, even if
// a limit has since been lowered below the current count. A new series is
// tracked only if the cluster's, the tenant's and the metric name's series
// counts are all below their limits; otherwise AdmitKey returns a *LimitError
// for the first full one (in that order) and nothing is tracked. The
// returned error may be shared by later refusals of the same Session: do not
// modify it.
func (s *Session) AdmitKey(metric string, k Key) (hint uint64, err error) {
	sh := s.t.shard(k)
	sh.mu.Lock()
	if e, ok := sh.m.touch(k, s.now); ok {
		sh.mu.Unlock()
		return e.hint, nil
	}
	sh.mu.Unlock()
	return 0, s.admitNew(sh, metric, k)
}

// SetHint stores hint with the tracked series k of tenant, for AdmitKey to
// return. It does nothing if k is not tracked (any more).
func (l *Limiter) SetHint(tenant string, k Key, hint uint64) {
	sh := l.tenant(tenant).shard(k)
	sh.mu.Lock()
	sh.m.setHint(k, hint)
	sh.mu.Unlock()
}

func (t *tenant) shard(k Key) *shard { return &t.shards[k[1]>>(64-shardBits)] }

func (s *Session) admitNew(sh *shard, metric string, k Key) error {
	t, lim := s.t, s.lim
	cid, cs, mid, ms := t.acquire(s.cid, s.cs, s.cluster, metric)
	defer t.mu.RUnlock()
	s.cid, s.cs = cid, cs

	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m.touch(k, s.now); ok { // admitted concurrently
		return nil
	}
	maxCluster := lim.MaxSeriesPerCluster
	if s.cluster == "" {
		maxCluster = 0 // no cluster to hold to account: only tenant and metric limits apply
	}
	if !tryInc(&cs.n, maxCluster) {
		return s.refuse(0, LimitSeriesPerCluster, lim.MaxSeriesPerCluster)
	}
	if !tryInc(&t.series, lim.MaxSeriesPerTenant) {
		cs.n.Add(-1)
		return s.refuse(1, LimitSeriesPerTenant, lim.MaxSeriesPerTenant)
	}
	if !tryInc(&ms.n, lim.MaxSeriesPerMetric) {
		t.series.Add(-1)
		cs.n.Add(-1)
		return s.refuse(2, LimitSeriesPerMetric, lim.MaxSeriesPerMetric)
	}
	sh.m.insert(k, entry{seen: s.now, cluster: cid, metric: mid})
	s.l.tracked.Add(1)
	return nil
}

func (s *Session) refuse(i int, limit string, value int) error {
	s.l.m.rejected[limit].Inc()
	if s.errs[i] == nil {
		s.errs[i] = &LimitError{Limit: limit, Value: float64(value)}
	}
	return s.errs[i]
}

// tryInc adds one to c unless that would exceed max (0 = unlimited).
func tryInc(c *atomic.Int64, max int) bool {
	if max <= 0 {
		c.Add(1)
		return true
	}
	if c.Add(1) > int64(max) {
		c.Add(-1)
		return false
	}
	return true
}
