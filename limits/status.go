package limits

import (
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Cluster tracking, for the receiver's status page.
//
// With TrackClusters on, every cluster the limiter knows (the clusters
// interner of its tenant) carries a clusterStat: when it was last seen,
// the samples admitted for it, a samples/s figure, the remote-write
// protocol, client (User-Agent) and gathering-definition version of its
// last request, and its refusals by reason. Everything is updated with
// atomics, once per request and cluster (Session.Done), plus once per
// refused series (Session.Refuse): the per-series admission path only adds
// an integer to a Session field.
//
// Memory: a clusterStat is 48 bytes (a size class of Go's allocator)
// plus a pointer in the cluster's interner entry; a cluster with refusals
// gets a counter array of 8 bytes per reason the first time it is refused.
// A cluster whose series have all expired stays in the interner (its name,
// about 100 bytes with the map slot) until it has been silent for
// ClusterRetention, so the page can list it as gone silent, also across a
// restart (status_restore.go). bench/status measures the total per
// cluster.
//
// Per tenant there is a fixed-size ring of the most recent refusals, one
// per request, cluster and reason, with one example label set each.

// ClusterRetention is how long a cluster without series stays known after
// it was last seen: a day and an hour, so "seen in the last 24 h" counts
// every cluster that was.
const ClusterRetention = 25 * time.Hour

// RateWindow is the window of the clusters' and tenants' samples/s: the
// samples admitted over the last completed window, divided by its length.
// It spans two forwarder intervals (4m30s by default), so a cluster
// reporting on time never shows 0. Until a cluster's or tenant's first
// window has completed (the receiver started, or the cluster appeared,
// since the last one closed) its rate is a partial one: over the part of
// the current window elapsed, at least RateMinSpan, and marked so.
const RateWindow = 10 * time.Minute

// RateMinSpan is the shortest span a partial rate is averaged over, so
// that the first request after a start does not read as a burst.
const RateMinSpan = time.Minute

// recentRefusals is the size of each tenant's ring of recent refusals.
const recentRefusals = 1024

// maxNames bounds the interned protocol, client and definition strings:
// clients choose them, so an unbounded table could be grown at will. Past
// it new values show as "other".
const maxNames = 1<<16 - 2

// maxExampleBytes bounds one refusal's example label set.
const maxExampleBytes = 1024

// tracker is the state of TrackClusters, immutable once set except for the
// names table.
type tracker struct {
	reasons []string       // index → reason; the last is "other"
	index   map[string]int // reason → index

	mu    sync.RWMutex
	ids   map[string]uint16
	names []string // id-1 → name; id 0 is "" (unknown)

	// roll is held for writing while rollRates runs, and for reading by
	// the snapshots, so that no snapshot sees a stat of one window with the
	// start of another. Taken before a tenant's mu.
	roll     sync.RWMutex
	lastRoll atomic.Int64 // unix nanoseconds of the last rate roll
}

// clusterStat is one cluster's tracking. All fields are atomics: it is
// updated by concurrent requests and read by the status API.
type clusterStat struct {
	lastSeen atomic.Uint32 // Limiter seconds + seenBias; 0 = never
	rate     atomic.Uint32 // float32 bits: samples/s over the last RateWindow
	client   atomic.Uint64 // proto id <<32 | agent id <<16 | definition id
	samples  atomic.Uint64 // admitted samples, total
	prev     atomic.Uint64 // samples at the last roll
	rolled   atomic.Bool   // rate holds a completed window
	// restored is the series count of a cluster restored from the
	// previous process (RestoreClusters), shown until it writes again or
	// its series would have expired. It fills rolled's padding: the stat
	// stays 48 bytes.
	restored atomic.Uint32
	refused  atomic.Pointer[[]atomic.Uint64]
}

// seenBias offsets clusterStat.lastSeen so that it holds times up to
// ClusterRetention before the Limiter started: those of the clusters
// restored from the previous process.
const seenBias = uint32(ClusterRetention/time.Second) + 1

// seenAt encodes sec, the Limiter's seconds, for clusterStat.lastSeen.
func seenAt(sec uint32) uint32 { return min(sec, math.MaxUint32-seenBias) + seenBias }

// seenCode encodes t for clusterStat.lastSeen, rounded down to a second:
// at least 1, for a time more than ClusterRetention before the epoch.
func (l *Limiter) seenCode(t time.Time) uint32 {
	d := t.Sub(l.epoch)
	sec := int64(d / time.Second)
	if d%time.Second < 0 {
		sec-- // floor, not towards zero
	}
	return uint32(min(max(sec+int64(seenBias), 1), math.MaxUint32))
}

// seenTime decodes clusterStat.lastSeen, which must not be 0.
func (l *Limiter) seenTime(seen uint32) time.Time {
	return l.epoch.Add(time.Duration(int64(seen)-int64(seenBias)) * time.Second)
}

// tenantStat is a tenant's tracking.
type tenantStat struct {
	samples atomic.Uint64
	refused []atomic.Uint64 // by reason index
	rate    atomic.Uint64   // float64 bits: samples/s over the last RateWindow
	prev    atomic.Uint64   // samples at the last roll
	rolled  atomic.Bool     // rate holds a completed window

	mu     sync.Mutex
	recent [recentRefusals]Refusal
	next   int // index of the next write in recent
	n      int // entries in recent
}

// Refusal is one refused request, series or group of series of a cluster,
// with an example of what was refused.
type Refusal struct {
	Time    time.Time
	Cluster string
	Reason  string
	// Count is the samples refused for this reason in the request.
	Count int
	// Example is one refused series' label set (`{__name__="...", ...}`),
	// empty for a refusal of a whole request.
	Example string
}

// TrackClusters turns on the per-cluster tracking the status page reads.
// reasons are the refusal reasons the caller will pass to Session.Refuse
// and Refused; others are counted as "other". Call it once, before the
// first write; later calls are ignored.
func (l *Limiter) TrackClusters(reasons []string) {
	tr := &tracker{index: map[string]int{}, ids: map[string]uint16{}}
	for _, r := range reasons {
		if _, dup := tr.index[r]; !dup && r != "other" {
			tr.index[r] = len(tr.reasons)
			tr.reasons = append(tr.reasons, r)
		}
	}
	tr.index["other"] = len(tr.reasons)
	tr.reasons = append(tr.reasons, "other")
	tr.lastRoll.Store(l.now().UnixNano())
	l.track.CompareAndSwap(nil, tr)
}

// Tracking reports whether TrackClusters was called.
func (l *Limiter) Tracking() bool { return l.track.Load() != nil }

func (tr *tracker) reason(r string) int {
	if i, ok := tr.index[r]; ok {
		return i
	}
	return len(tr.reasons) - 1
}

// id interns name; 0 for "", maxNames+1 for "other" once the table is full.
func (tr *tracker) id(name string) uint16 {
	if name == "" {
		return 0
	}
	tr.mu.RLock()
	id, ok := tr.ids[name]
	tr.mu.RUnlock()
	if ok {
		return id
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if id, ok := tr.ids[name]; ok {
		return id
	}
	if len(tr.names) >= maxNames {
		return maxNames + 1
	}
	tr.names = append(tr.names, strings.Clone(name))
	id = uint16(len(tr.names))
	tr.ids[tr.names[id-1]] = id
	return id
}

func (tr *tracker) name(id uint16) string {
	switch {
	case id == 0:
		return ""
	case id > maxNames:
		return "other"
	}
	tr.mu.RLock()
	defer tr.mu.RUnlock()
	return tr.names[id-1]
}

// stats returns t's tenantStat, creating it.
func (t *tenant) stats(tr *tracker) *tenantStat {
	if ts := t.tstat.Load(); ts != nil {
		return ts
	}
	t.tstat.CompareAndSwap(nil, &tenantStat{refused: make([]atomic.Uint64, len(tr.reasons))})
	return t.tstat.Load()
}

// clusterStat returns the stat of cluster, adding the cluster to t's
// interner if it is not there (a cluster whose every series was refused).
// cs is reused if still live.
func (t *tenant) clusterStat(cluster string, cs *counted) *clusterStat {
	for {
		t.mu.RLock()
		if cs == nil || cs.dead {
			_, cs, _ = t.clusters.get(cluster)
		}
		if cs != nil {
			st := cs.stat.Load()
			if st == nil {
				cs.stat.CompareAndSwap(nil, &clusterStat{})
				st = cs.stat.Load()
			}
			t.mu.RUnlock()
			return st
		}
		t.mu.RUnlock()
		t.mu.Lock()
		t.clusters.add(cluster)
		t.mu.Unlock()
	}
}

// keepCluster says whether gc may not collect the cluster c yet.
func keepCluster(c *counted, now, retention uint32) bool {
	st := c.stat.Load()
	if st == nil {
		return false
	}
	seen := st.lastSeen.Load()
	return seen > 0 && int64(now)+int64(seenBias)-int64(seen) <= int64(retention)
}

// Accept counts samples admitted in this Session, for the cluster's
// samples/s. It only adds to the Session; Done publishes.
func (s *Session) Accept(samples int) { s.samples += int64(samples) }

// Definition records the gathering-definition version the cluster reports
// (the version label of its gathering info series). Done publishes it.
func (s *Session) Definition(version string) { s.def = version }

// Refuse records that samples of this Session's cluster were refused for
// reason. example is called at most once per reason and Session, for the
// label set kept in the tenant's ring of recent refusals; it may be nil.
// Without tracking it does nothing.
func (s *Session) Refuse(reason string, samples int, example func() string) {
	tr := s.l.track.Load()
	if tr == nil {
		return
	}
	i := tr.reason(reason)
	n := uint64(max(samples, 1))
	s.t.stats(tr).refused[i].Add(n)
	if st := s.stat(); st != nil {
		st.refuse(i, n, len(tr.reasons))
	}
	if i < 64 && s.reported&(1<<i) == 0 {
		s.reported |= 1 << i
		var ex string
		if example != nil {
			ex = example()
			if len(ex) > maxExampleBytes {
				ex = ex[:maxExampleBytes] + "…"
			}
		}
		s.t.stats(tr).record(Refusal{Time: s.l.now(), Cluster: strings.Clone(s.cluster), Reason: tr.reasons[i], Count: int(n), Example: strings.Clone(ex)})
	} else {
		s.t.stats(tr).addCount(s.cluster, tr.reasons[i], int(n))
	}
}

// Done publishes what the Session saw: the cluster was seen now, with the
// protocol and client (e.g. User-Agent) of its request (empty keeps the
// previous ones), and the samples it had admitted. Call it once, at the
// end of the request. Without tracking it does nothing.
func (s *Session) Done(proto, client string) {
	tr := s.l.track.Load()
	if tr == nil {
		return
	}
	if s.samples > 0 {
		s.t.stats(tr).samples.Add(uint64(s.samples))
	}
	st := s.stat()
	if st == nil {
		return
	}
	st.lastSeen.Store(seenAt(s.now))
	if st.restored.Load() != 0 { // its series count is the live one again
		st.restored.Store(0)
	}
	if s.samples > 0 {
		st.samples.Add(uint64(s.samples))
		s.samples = 0
	}
	old := st.client.Load()
	nw := old
	if proto != "" {
		nw = nw&^(0xffff<<32) | uint64(tr.id(proto))<<32
	}
	if client != "" {
		nw = nw&^(0xffff<<16) | uint64(tr.id(client))<<16
	}
	if s.def != "" {
		nw = nw&^0xffff | uint64(tr.id(s.def))
	}
	if nw != old {
		st.client.Store(nw)
	}
}

// stat returns the Session's cluster stat, nil for no cluster.
func (s *Session) stat() *clusterStat {
	if s.cluster == "" {
		return nil
	}
	if s.st == nil {
		s.st = s.t.clusterStat(s.cluster, s.cs)
	}
	return s.st
}

// Refused records a refusal of a whole request of cluster (a rate limit):
// samples refused for reason. It counts as the cluster being seen.
func (l *Limiter) Refused(tenant, cluster, reason string, samples int) {
	if l.track.Load() == nil {
		return
	}
	s := l.Session(tenant, cluster)
	s.Refuse(reason, samples, nil)
	s.Done("", "")
}

func (st *clusterStat) refuse(i int, n uint64, reasons int) {
	r := st.refused.Load()
	if r == nil {
		fresh := make([]atomic.Uint64, reasons)
		st.refused.CompareAndSwap(nil, &fresh)
		r = st.refused.Load()
	}
	(*r)[i].Add(n)
}

func (ts *tenantStat) record(r Refusal) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.recent[ts.next] = r
	ts.next = (ts.next + 1) % recentRefusals
	ts.n = min(ts.n+1, recentRefusals)
}

// addCount adds n to the newest ring entry of cluster and reason, which
// the same request recorded: one entry per request, cluster and reason.
func (ts *tenantStat) addCount(cluster, reason string, n int) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for k := 1; k <= min(ts.n, 16); k++ {
		e := &ts.recent[(ts.next-k+recentRefusals)%recentRefusals]
		if e.Cluster == cluster && e.Reason == reason {
			e.Count += n
			return
		}
	}
}

// rollRates updates every cluster's and tenant's samples/s once per
// RateWindow.
func (l *Limiter) rollRates(now time.Time) {
	tr := l.track.Load()
	if tr == nil {
		return
	}
	last := tr.lastRoll.Load()
	elapsed := now.UnixNano() - last
	if elapsed < int64(RateWindow) {
		return
	}
	tr.roll.Lock()
	defer tr.roll.Unlock()
	if !tr.lastRoll.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	secs := float64(elapsed) / 1e9
	l.tenants.Range(func(_, v any) bool {
		t := v.(*tenant)
		t.mu.RLock()
		for _, c := range t.clusters.byID {
			if c == nil {
				continue
			}
			if st := c.stat.Load(); st != nil {
				cur := st.samples.Load()
				r := float64(cur-st.prev.Load()) / secs
				st.prev.Store(cur)
				st.rate.Store(math.Float32bits(float32(r)))
				st.rolled.Store(true)
			}
		}
		t.mu.RUnlock()
		if ts := t.tstat.Load(); ts != nil {
			cur := ts.samples.Load()
			ts.rate.Store(math.Float64bits(float64(cur-ts.prev.Load()) / secs))
			ts.prev.Store(cur)
			ts.rolled.Store(true)
		}
		return true
	})
}

// Rate is a samples/s figure and the span it is averaged over.
type Rate struct {
	Value float64 // samples/s
	// Span is RateWindow for a completed window (divided by the time
	// between two rolls, RateWindow to a minute more). Partial is true before
	// the first window of the cluster or tenant has completed: the rate is
	// then over the part of the current window elapsed, at least
	// RateMinSpan, and Span says how long that is.
	Span    time.Duration
	Partial bool
}

// rate returns a counter's Rate: the completed window's rate when rolled,
// else the samples it counted since the current window began (all of them:
// a counter that was never rolled started after the last roll) over the
// time elapsed since. Call it with tr.roll held for reading.
func (tr *tracker) rate(rolled bool, completed float64, samples uint64, now time.Time) Rate {
	if rolled {
		return Rate{Value: completed, Span: RateWindow}
	}
	span := max(now.Sub(time.Unix(0, tr.lastRoll.Load())), RateMinSpan)
	return Rate{Value: float64(samples) / span.Seconds(), Span: span, Partial: true}
}

// ClusterStatus is a snapshot of one cluster's tracking.
type ClusterStatus struct {
	ID string
	// Series is its active series counted towards the limits; for a
	// cluster restored from the previous process (RestoreClusters) that
	// has not written since, those it had then, until they would have
	// expired (series_idle_timeout after LastSeen): none count here.
	Series int64
	// LastSeen is the time of its last request, by this process or the
	// previous one (RestoreClusters); zero if it has only been seen before
	// tracking started.
	LastSeen time.Time
	// Samples is the number admitted since the receiver started, and
	// Rate their samples/s over the last completed RateWindow, or
	// a partial rate before one has (see Rate).
	Samples uint64
	Rate    Rate
	// Refused is the samples refused, all reasons, since the receiver
	// started, plus those restored with the cluster (RestoreClusters).
	Refused uint64

	st *clusterStat
	tr *tracker
}

// Refusals returns the cluster's refused samples by reason, without zeros.
func (c *ClusterStatus) Refusals() map[string]uint64 {
	out := map[string]uint64{}
	if c.st == nil {
		return out
	}
	if r := c.st.refused.Load(); r != nil {
		for i := range *r {
			if n := (*r)[i].Load(); n > 0 {
				out[c.tr.reasons[i]] = n
			}
		}
	}
	return out
}

// Client returns the remote-write protocol, client and gathering-definition
// version of the cluster's last request ("" where unknown).
func (c *ClusterStatus) Client() (proto, client, definition string) {
	if c.st == nil {
		return "", "", ""
	}
	v := c.st.client.Load()
	return c.tr.name(uint16(v >> 32)), c.tr.name(uint16(v >> 16)), c.tr.name(uint16(v))
}

// clusterStatus snapshots c, a cluster of a tenant whose series expire
// after idle; call it with tr.roll held for reading.
func (l *Limiter) clusterStatus(tr *tracker, c *counted, now time.Time, idle time.Duration) ClusterStatus {
	cs := ClusterStatus{ID: c.name, Series: c.n.Load(), tr: tr}
	st := c.stat.Load()
	if st == nil {
		cs.Rate = tr.rate(false, 0, 0, now)
		return cs
	}
	cs.st = st
	if seen := st.lastSeen.Load(); seen > 0 {
		cs.LastSeen = l.seenTime(seen)
	}
	if n := st.restored.Load(); n > 0 && cs.Series == 0 && now.Sub(cs.LastSeen) <= idle {
		cs.Series = int64(n)
	}
	cs.Samples = st.samples.Load()
	cs.Rate = tr.rate(st.rolled.Load(), float64(math.Float32frombits(st.rate.Load())), cs.Samples, now)
	if r := st.refused.Load(); r != nil {
		for i := range *r {
			cs.Refused += (*r)[i].Load()
		}
	}
	return cs
}

// Clusters returns a snapshot of every cluster of tenant, in no order;
// nil without tracking or for an unknown tenant. It holds the tenant's name
// lock for reading while it copies (about 10 ms per 100k clusters), which
// delays only the admission of series of clusters or metric names new to
// the tenant, and a roll of the rates.
func (l *Limiter) Clusters(tenantName string) []ClusterStatus {
	tr := l.track.Load()
	v, ok := l.tenants.Load(tenantName)
	if tr == nil || !ok {
		return nil
	}
	t := v.(*tenant)
	now := l.now()
	idle := l.cfg.Load().forTenant(tenantName).SeriesIdleTimeout
	tr.roll.RLock()
	defer tr.roll.RUnlock()
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]ClusterStatus, 0, len(t.clusters.ids))
	for _, c := range t.clusters.byID {
		if c == nil || c.name == "" {
			continue
		}
		out = append(out, l.clusterStatus(tr, c, now, idle))
	}
	return out
}

// Cluster returns the snapshot of one cluster of tenant.
func (l *Limiter) Cluster(tenantName, id string) (ClusterStatus, bool) {
	tr := l.track.Load()
	v, ok := l.tenants.Load(tenantName)
	if tr == nil || !ok || id == "" {
		return ClusterStatus{}, false
	}
	t := v.(*tenant)
	now := l.now()
	tr.roll.RLock()
	defer tr.roll.RUnlock()
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, c, ok := t.clusters.get(id)
	if !ok {
		return ClusterStatus{}, false
	}
	return l.clusterStatus(tr, c, now, l.cfg.Load().forTenant(tenantName).SeriesIdleTimeout), true
}

// TenantStatus is a snapshot of one tenant's tracking.
type TenantStatus struct {
	Name    string
	Series  int64
	Samples uint64
	Rate    Rate // of Samples, as a cluster's
	Refused map[string]uint64
	Limits  TenantLimits
}

// Tenants returns the tenants the limiter has seen, sorted.
func (l *Limiter) Tenants() []string {
	var names []string
	l.tenants.Range(func(k, _ any) bool {
		names = append(names, k.(string))
		return true
	})
	slices.Sort(names)
	return names
}

// Tenant returns the snapshot of tenant; ok is false for a tenant that
// has not written (its limits are still filled in).
func (l *Limiter) Tenant(name string) (ts TenantStatus, ok bool) {
	ts = TenantStatus{Name: name, Refused: map[string]uint64{}, Limits: l.For(name)}
	v, ok := l.tenants.Load(name)
	if !ok {
		return ts, false
	}
	t := v.(*tenant)
	ts.Series = t.series.Load()
	tr := l.track.Load()
	if tr == nil {
		return ts, true
	}
	now := l.now()
	tr.roll.RLock()
	st := t.tstat.Load()
	if st == nil {
		ts.Rate = tr.rate(false, 0, 0, now)
		tr.roll.RUnlock()
		return ts, true
	}
	ts.Samples = st.samples.Load()
	ts.Rate = tr.rate(st.rolled.Load(), math.Float64frombits(st.rate.Load()), ts.Samples, now)
	tr.roll.RUnlock()
	for i := range st.refused {
		if n := st.refused[i].Load(); n > 0 {
			ts.Refused[tr.reasons[i]] = n
		}
	}
	return ts, true
}

// RecentRefusals returns tenant's most recent refusals, newest first; only
// those of cluster unless it is empty.
func (l *Limiter) RecentRefusals(tenantName, cluster string) []Refusal {
	v, ok := l.tenants.Load(tenantName)
	if !ok {
		return nil
	}
	st := v.(*tenant).tstat.Load()
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []Refusal
	for k := 1; k <= st.n; k++ {
		r := st.recent[(st.next-k+recentRefusals)%recentRefusals]
		if cluster == "" || r.Cluster == cluster {
			out = append(out, r)
		}
	}
	return out
}

// Reasons returns the refusal reasons tracked, "other" last; nil without
// tracking.
func (l *Limiter) Reasons() []string {
	if tr := l.track.Load(); tr != nil {
		return slices.Clone(tr.reasons)
	}
	return nil
}

// ClustersSeen counts the clusters of tenant last seen at or after each
// of since, without copying them; zeros without tracking.
func (l *Limiter) ClustersSeen(tenantName string, since ...time.Time) []int {
	out := make([]int, len(since))
	v, ok := l.tenants.Load(tenantName)
	if l.track.Load() == nil || !ok {
		return out
	}
	secs := make([]uint32, len(since))
	for i, t := range since {
		secs[i] = l.seenCode(t)
	}
	t := v.(*tenant)
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, c := range t.clusters.byID {
		if c == nil {
			continue
		}
		st := c.stat.Load()
		if st == nil {
			continue
		}
		seen := st.lastSeen.Load()
		for i, s := range secs {
			if seen >= s {
				out[i]++
			}
		}
	}
	return out
}
