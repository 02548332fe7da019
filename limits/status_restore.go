package limits

import (
	"math"
	"time"
)

// Cluster tracking across restarts.
//
// The status page's main job is to list the clusters that stopped
// reporting, and a restart (an upgrade) is when some do not come back. The
// receiver saves what the page shows of each cluster (SavedClusters) and
// restores it into the next process (RestoreClusters) before the first
// write: a restored cluster is a name in the tenant's clusters interner,
// with no series, and a clusterStat holding its last-seen time, client
// strings, refusals and series count. No series counts towards a limit:
// the limits count what was written since the start. A restored cluster
// that does not write again is collected ClusterRetention after it was
// last seen, like one that went silent in this process.

// SavedCluster is what the status page shows of a cluster that has not
// written since a restart.
type SavedCluster struct {
	ID       string
	LastSeen time.Time
	// Series is the cluster's series count as the page showed it.
	Series                       int64
	Protocol, Client, Definition string
	Refused                      map[string]uint64 // by reason; nil for none
}

// SavedClusters returns the clusters of tenant the page shows with a
// last-seen time, in no order; nil without tracking or for an unknown
// tenant. It holds the tenant's name lock for reading while it copies,
// as Clusters does.
func (l *Limiter) SavedClusters(tenantName string) []SavedCluster {
	all := l.Clusters(tenantName)
	if len(all) == 0 {
		return nil
	}
	out := make([]SavedCluster, 0, len(all))
	for i := range all {
		c := &all[i]
		if c.LastSeen.IsZero() {
			continue
		}
		sc := SavedCluster{ID: c.ID, LastSeen: c.LastSeen, Series: c.Series}
		sc.Protocol, sc.Client, sc.Definition = c.Client()
		if c.Refused > 0 {
			sc.Refused = c.Refusals()
		}
		out = append(out, sc)
	}
	return out
}

// RestoreClusters adds the saved clusters of tenant, as the previous
// process last showed them, and returns how many it added. A cluster
// already known to the limiter keeps its own state (it has written since
// the start), and one last seen more than ClusterRetention ago is skipped
// (it would be collected at once). A LastSeen in the future counts as
// now. Refusals of a reason the limiter does not track count as "other".
// Without tracking it does nothing.
//
// Call it before the first write: a cluster's Session started before its
// restore updates a stat the restore does not see.
func (l *Limiter) RestoreClusters(tenantName string, saved []SavedCluster) int {
	tr := l.track.Load()
	if tr == nil || len(saved) == 0 {
		return 0
	}
	now := l.now()
	nowCode := seenAt(l.seconds(now))
	oldest := now.Add(-ClusterRetention)
	stats := make([]*clusterStat, len(saved)) // built before the lock: tr.id locks the names table
	var valid int
	for i := range saved {
		sc := &saved[i]
		if sc.ID == "" || !sc.LastSeen.After(oldest) {
			continue
		}
		st := &clusterStat{}
		st.lastSeen.Store(min(l.seenCode(sc.LastSeen.Add(time.Second/2)), nowCode)) // to the nearest of this process's seconds
		st.restored.Store(uint32(min(max(sc.Series, 0), math.MaxUint32)))
		st.client.Store(uint64(tr.id(sc.Protocol))<<32 | uint64(tr.id(sc.Client))<<16 | uint64(tr.id(sc.Definition)))
		for reason, count := range sc.Refused {
			if count > 0 {
				st.refuse(tr.reason(reason), count, len(tr.reasons))
			}
		}
		stats[i] = st
		valid++
	}
	if valid == 0 { // no tenant made for nothing
		return 0
	}
	t := l.tenant(tenantName)
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int
	for i, st := range stats {
		if st == nil {
			continue
		}
		if _, known := t.clusters.ids[saved[i].ID]; known { // written since the start, or saved twice
			continue
		}
		_, c := t.clusters.add(saved[i].ID)
		c.stat.Store(st)
		n++
	}
	return n
}
