package push

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/phonehome/phonehome/allowlist"
)

// Erase drops the tenant's aggregated series that match every matcher (an
// erasure: a cluster's _id, or a selector) and snapshots the state at once,
// so that neither the next flush nor a replay of the push log brings them
// back, and the log no longer holds them. It waits for a flush in progress:
// the caller erases storage after it, and no flush writes the series
// between the two. It returns how many series went.
func (g *Gateway) Erase(tenant string, ms []*labels.Matcher) (int, error) {
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.commitLocked() // a pending record of the cluster would come back after the erasure
	st := g.state[tenant]
	if st == nil {
		return 0, nil
	}
	n := 0
	for k, it := range st.Series {
		if allowlist.MatchesAll(ms, it.Labels.Get) {
			delete(st.Series, k)
			n++
		}
	}
	if n == 0 {
		return 0, nil
	}
	st.dropOrphanLayouts()
	// The eviction order and the fresh list hold the erased series' labels
	// (the cluster's _id among them) until the next flush: drop them now.
	st.evict = nil
	st.fresh = slices.DeleteFunc(st.fresh, func(f freshSeries) bool { return !st.isFresh(f) })
	g.reinternLocked() // nor may the symbol table keep them
	if g.broken == nil {
		err := g.log.compact(g.state, g.seq)
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, errRewind) {
			return n, fmt.Errorf("erase from push state: %w", err)
		}
		g.logFailedLocked(err) // rewrites the snapshot, erasure included, if it can
	} else {
		g.recoverLocked()
	}
	if g.broken != nil {
		return n, fmt.Errorf("erase from push state: %w", g.broken)
	}
	return n, nil
}

// dropOrphanLayouts drops the bucket layouts of histograms none of whose
// series remain: their keys hold every label of the histogram, the erased
// _id included, and a layout without series constrains nothing.
func (ts *tenantState) dropOrphanLayouts() {
	if len(ts.Layouts) == 0 {
		return
	}
	kept := map[string]bool{}
	for _, it := range ts.Series {
		if k, ok := layoutKeyOf(it.Labels); ok {
			kept[k] = true
		}
	}
	for k := range ts.Layouts {
		if !kept[k] {
			delete(ts.Layouts, k)
			delete(ts.LayoutTouched, k)
		}
	}
}

// layoutKeyOf is the key of the histogram layout a _bucket, _sum or _count
// series belongs to (as addSamples makes it).
func layoutKeyOf(ls labels.Labels) (string, bool) {
	name := ls.Get(model.MetricNameLabel)
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			b := labels.NewBuilder(ls)
			b.Del(model.BucketLabel)
			b.Set(model.MetricNameLabel, base)
			return b.Labels().String(), true
		}
	}
	return "", false
}
