package limits

// Forget drops what the limiter holds of cluster in tenant, for the erasure
// of that cluster: its tracked series (their slots in the cluster's, the
// tenant's and the metric names' counts free up at once), its status-page
// stats and its entries among the tenant's recent refusals, its rate bucket
// (a cluster admitted again starts with a full one), and its interned name.
// The requests of the cluster in flight keep their in-flight count, and with
// it the name, until they end. It returns the number of series forgotten and
// whether the limiter knew the cluster at all.
//
// The caller refuses the cluster's writes before it calls Forget (the
// erasure's deny list): a series admitted afterwards is tracked again. One
// admitted concurrently is either forgotten or keeps the cluster's name
// known, with consistent counts (the name goes only once no series counts
// on it).
//
// It locks one series shard at a time, as Expire does, so the tenant's
// other writes proceed.
func (l *Limiter) Forget(tenantName, cluster string) (series int, known bool) {
	v, ok := l.tenants.Load(tenantName)
	if !ok || cluster == "" { // "": the series of no cluster, not one to forget
		return 0, false
	}
	t := v.(*tenant)
	series, known = t.forgetSeries(cluster)
	t.series.Add(-int64(series))
	l.tracked.Add(-int64(series))
	if t.forgetName(cluster) {
		known = true
	}
	if ts := t.tstat.Load(); ts != nil && ts.forget(cluster) {
		known = true
	}
	t.rateMu.Lock()
	if _, ok := t.clusterRates[cluster]; ok {
		delete(t.clusterRates, cluster)
		known = true
	}
	t.rateMu.Unlock()
	return series, known
}

// forgetSeries removes cluster's series from every shard and their counts;
// it reports how many, and whether the cluster was interned.
func (t *tenant) forgetSeries(cluster string) (int, bool) {
	var n int
	t.mu.RLock()
	cid, cs, ok := t.clusters.get(cluster)
	t.mu.RUnlock()
	if !ok {
		return 0, false
	}
	for i := range t.shards {
		sh := &t.shards[i]
		t.mu.RLock()
		if cs.dead { // collected by Expire (no series left): cid may be another cluster's now
			t.mu.RUnlock()
			break
		}
		sh.mu.Lock()
		n += sh.m.deleteWhere(func(e entry) bool {
			if e.cluster != cid {
				return false
			}
			cs.n.Add(-1)
			t.metrics.byID[e.metric].n.Add(-1)
			return true
		})
		sh.mu.Unlock()
		t.mu.RUnlock()
	}
	return n, true
}

// forgetName drops cluster's stats and, if no series counts on it any
// more, its interned name; it reports whether the name was interned.
func (t *tenant) forgetName(cluster string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, c, ok := t.clusters.get(cluster)
	if !ok {
		return false
	}
	c.stat.Store(nil) // Sessions holding it update a detached copy
	if c.n.Load() == 0 {
		c.dead = true // as gc: an admission holding it looks the name up again
		delete(t.clusters.ids, c.name)
		t.clusters.byID[id] = nil
		t.clusters.free = append(t.clusters.free, id)
	}
	// Metric names left without series go at the next Expire.
	return true
}

// forget removes cluster's refusals from the ring, keeping the order of
// the others; it reports whether there were any.
func (ts *tenantStat) forget(cluster string) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	kept := make([]Refusal, 0, ts.n)
	for k := ts.n; k >= 1; k-- { // oldest first
		if r := ts.recent[(ts.next-k+recentRefusals)%recentRefusals]; r.Cluster != cluster {
			kept = append(kept, r)
		}
	}
	if len(kept) == ts.n {
		return false
	}
	clear(ts.recent[:])
	copy(ts.recent[:], kept)
	ts.n, ts.next = len(kept), len(kept)%recentRefusals
	return true
}
