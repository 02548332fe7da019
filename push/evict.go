package push

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"
	"unique"
)

// The series budget evicts only series whose value a flush has written to
// the TSDB, so what may go changes at a flush, and between two flushes only
// by pushes (a series pushed again is unflushed until the next flush) and
// drops (evictions, erasure, expiry). The order of the evictable series is
// therefore built once per flush and consumed by the pushes until the next
// flush, instead of scanning and sorting the tenant's series under the
// Gateway's mutex for every push. At a full budget of 100k series a push
// took 75-455 ms before, about 90 µs after (BenchmarkPushEvict, medians of
// 6 on a loaded 2-core box: push/testdata/bench-evict.txt).
//
// The build sorts every series: 40-130 ms at 100k on a loaded 2-core box
// (BenchmarkEvictOrderBuild). The flush does it (Gateway.flushed), outside
// the mutex, so that no push or read of the state waits for it: under the
// mutex it only clones the tenant's series map, which its snapshot and TSDB
// write read too (copyForFlush, tenantCopy), and installs the order. The
// first push that needs room after a flush took 42 ms at 100k series, and
// held every other push as long; it takes 0.1 ms now
// (BenchmarkFirstEvictionAfterFlush,
// push/testdata/bench-evict-flush.txt). A push that finds no order for the
// last flush (none has run since the start, or an erasure dropped it)
// builds it under the mutex.

// evictUnit is what the budget evicts at once: one series, or a histogram
// whole (its buckets, sum and count), or it would be left with buckets summed
// over different pushes.
type evictUnit struct {
	key     string   // its series key, or "\xffh" + layout key (not a series key: those start with a label name)
	keys    []string // the series' keys
	items   []*aggItem
	once    bool   // every series was pushed once
	touched int64  // the last push of any of its series (Unix ms)
	seq     uint64 // the last record that added to any of them
}

// evictOrder is a tenant's units that are in the TSDB as of the flush at
// Seq flushedSeq, in eviction order: first those pushed once, then the
// others (evictable once idle for EvictIdleAfter), each least recently
// pushed first. A unit leaves it for good when one of its series is pushed
// (it is unflushed then) or dropped; the next flush's order holds it again.
type evictOrder struct {
	flushedSeq  uint64
	once, often []*evictUnit
}

// evictOrder returns the tenant's order as of its last flush, building it if
// that flush is newer than the order (see Gateway.flushed for the usual
// way).
func (ts *tenantState) evictOrder() *evictOrder {
	if ts.evict == nil || ts.evict.flushedSeq != ts.flushedSeq {
		ts.evict = buildEvictOrder(ts.flushedSeq, ts.evictCandidates())
	}
	return ts.evict
}

// evictCopy is what a flush's eviction order is built from: the
// candidates taken from its copy of the tenant's series (copyForFlush).
type evictCopy struct {
	ts    *tenantState
	cands []evictCandidate // nil if the order as of the flush was built already
}

// flushed notes that the tenant's series up to Seq seq are in its TSDB
// (tenantState.flushed), and installs the eviction order as of then, which
// it builds from the flush's copy outside the mutex. Until then pushes use
// the previous flush's order, which stays valid. The copy was made at Seq
// seq, no record pending: a series pushed or dropped since is skipped when
// the order is consumed (evictOrder.current), and one created since is
// unflushed, so no order may hold it. Flush's flushMu keeps Erase and
// expiry, the only ways to drop a tenant's state, from running meanwhile:
// c.ts is the tenant's state.
func (g *Gateway) flushed(seq uint64, c evictCopy) {
	var o *evictOrder
	if c.cands != nil {
		o = g.buildEvictOrder(seq, c.cands)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	c.ts.flushed(seq)
	if o != nil {
		c.ts.evict = o
	}
}

// evictCandidate is what the eviction order needs of one series, copied so
// that the order is built without the Gateway's mutex.
type evictCandidate struct {
	key     string
	it      *aggItem
	layout  string // the key of the histogram it belongs to, or ""
	touched int64
	seq     uint64
	once    bool // pushed once
}

// evictCandidates copies what the eviction order needs of each series.
// Called with the Gateway's mutex held.
func (ts *tenantState) evictCandidates() []evictCandidate {
	return evictCandidates(ts.Layouts, ts.Series)
}

// evictCandidates copies what the eviction order needs of each series of a
// tenant whose histogram layouts are layouts, decoding no label
// (aggItem.layout): with the Gateway's mutex held, or from a flush's copy
// (tenantCopy) without it.
func evictCandidates(layouts map[string]string, series map[string]*aggItem) []evictCandidate {
	cands := make([]evictCandidate, 0, len(series))
	for k, it := range series {
		c := evictCandidate{key: k, it: it, touched: it.Touched, seq: it.seq, once: it.Pushes == 1}
		if lk, hist := layoutOf(layouts, it); hist {
			c.layout = lk
		}
		cands = append(cands, c)
	}
	return cands
}

// buildEvictOrder groups the candidates into units and orders those in the
// TSDB as of the flush at flushedSeq. It reads only cands: no lock needed.
func buildEvictOrder(flushedSeq uint64, cands []evictCandidate) *evictOrder {
	o := &evictOrder{flushedSeq: flushedSeq}
	// Allocated once for all the units and their series (a histogram
	// appends its further series), not per series.
	units := make([]evictUnit, 0, len(cands))
	keys, items := make([]string, len(cands)), make([]*aggItem, len(cands))
	hists := map[string]int{} // layout key → index in units
	for _, c := range cands {
		uk := c.key
		if c.layout != "" {
			if i, seen := hists[c.layout]; seen {
				u := &units[i]
				u.keys, u.items = append(u.keys, c.key), append(u.items, c.it)
				u.once = u.once && c.once
				u.touched, u.seq = max(u.touched, c.touched), max(u.seq, c.seq)
				continue
			}
			hists[c.layout] = len(units)
			uk = "\xffh" + c.layout
		}
		i := len(units)
		keys[i], items[i] = c.key, c.it
		units = append(units, evictUnit{key: uk, keys: keys[i : i+1 : i+1], items: items[i : i+1 : i+1], once: c.once, touched: c.touched, seq: c.seq})
	}
	for i := range units {
		u := &units[i]
		switch {
		case u.seq > o.flushedSeq: // not in the TSDB yet
		case u.once:
			o.once = append(o.once, u)
		default:
			o.often = append(o.often, u)
		}
	}
	byAge := func(a, b *evictUnit) int {
		if c := cmp.Compare(a.touched, b.touched); c != 0 {
			return c
		}
		if c := cmp.Compare(a.seq, b.seq); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	}
	slices.SortFunc(o.once, byAge)
	slices.SortFunc(o.often, byAge)
	return o
}

// layoutOf is the key of the histogram layout (among layouts) the series
// belongs to, if it belongs to one.
func layoutOf(layouts map[string]string, it *aggItem) (string, bool) {
	if len(layouts) == 0 || it.layout == (unique.Handle[string]{}) {
		return "", false
	}
	lk := it.layout.Value()
	_, hist := layouts[lk]
	return lk, hist
}

// current reports whether none of u's series was dropped or pushed since
// the order was built. A unit that is not is marked, so as to be skipped at
// once from then on.
func (o *evictOrder) current(ts *tenantState, u *evictUnit) bool {
	if u.items == nil {
		return false
	}
	for i, k := range u.keys {
		if it := ts.Series[k]; it != u.items[i] || it.seq > o.flushedSeq {
			u.items = nil
			return false
		}
	}
	return true
}

// take appends to *chosen the units of *list, in order, that may go, and
// lowers *need by their series, until it is 0 or it meets a unit pushed
// since idleBefore (the rest are too: the list is ordered by the last push).
// It skips the units that the push (inPush) or a pending record touches or
// evicts, and those no longer current, which it drops from the list's head.
func (o *evictOrder) take(list *[]*evictUnit, v view, inPush map[string]float64, idleBefore int64, chosen *[]*evictUnit, need *int) {
	for len(*list) > 0 && !o.current(v.ts, (*list)[0]) {
		*list = (*list)[1:]
	}
	for _, u := range *list {
		if *need <= 0 || u.touched >= idleBefore {
			return
		}
		if !o.current(v.ts, u) || v.busy(u.keys, inPush) {
			continue
		}
		*chosen = append(*chosen, u)
		*need -= len(u.keys)
	}
}

// busy reports whether a pending record or the push (inPush) touches or
// evicts one of the series.
func (v view) busy(keys []string, inPush map[string]float64) bool {
	for _, k := range keys {
		_, pushed := inPush[k]
		_, pending := v.ps.values[k]
		if pushed || pending || v.ps.gone[k] {
			return true
		}
	}
	return false
}

// makeRoomLocked sets rec.Evict to series whose eviction makes room for
// need more, or says why there is none. The series budget is a cache, not a
// wall: a full one would otherwise refuse every new label set until
// series_ttl, and anyone holding the installer token can fill it with junk.
// It evicts only series whose value is in the TSDB already (flushed, and
// untouched by a pending record or by rec), so no acknowledged push is lost
// from storage; a later push of an evicted series starts it again from zero,
// as after expiry. First those pushed once — junk is typically pushed once,
// and a legitimate label set pushed once has its single value stored —
// then those pushed more often but untouched for EvictIdleAfter; least
// recently pushed first (evictOrder).
//
// If too few can go, the push is refused with 429 (Retry-After: the flush
// interval) only if the series that the next flush makes evictable — those
// pushed once since the last flush, pending ones included — would then make
// room for it, unless they are pushed again meanwhile, or if no flush has
// run since the start; else with 400, as waiting would not help.
func (g *Gateway) makeRoomLocked(rec *record, v view, inPush map[string]float64, need, created int, now int64) error {
	if created > g.cfg.MaxSeriesPerTenant {
		return reject(reasonSeriesLimit, errInvalid, "push would create %d new series, more than the tenant's limit of %d aggregated series", created, g.cfg.MaxSeriesPerTenant)
	}
	o := v.ts.evictOrder()
	var chosen []*evictUnit
	short := need
	o.take(&o.once, v, inPush, math.MaxInt64, &chosen, &short) // idle or not
	o.take(&o.often, v, inPush, now-time.Duration(g.cfg.EvictIdleAfter).Milliseconds(), &chosen, &short)
	if short > 0 {
		rj := reject(reasonSeriesLimit, errInvalid, "push would create %d new series; the tenant's limit of %d aggregated series is reached and too few can be evicted (only series written to storage and pushed once, or idle for push.evict_idle_after)", created, g.cfg.MaxSeriesPerTenant)
		// Until the first flush after a start nothing is evictable yet, and
		// idle series may be once it has run: only a retry can tell.
		if v.ts.flushedSeq == 0 || v.flushFrees(inPush, short) {
			rj.class, rj.retryAfter = errRateLimited, time.Duration(g.cfg.FlushInterval)
		}
		return rj
	}
	for _, u := range chosen {
		for _, it := range u.items {
			rec.Evict = append(rec.Evict, seriesRef{it.Labels})
		}
	}
	return nil
}

// flushFrees reports whether the next flush makes at least n more series
// evictable for a push of inPush: series pushed once since the last flush
// (tenantState.fresh), and the new series of pending records. It prunes
// fresh of the series that no longer count.
func (v view) flushFrees(inPush map[string]float64, n int) bool {
	for k := range v.ps.values {
		_, held := v.ts.Series[k]
		if _, pushed := inPush[k]; !held && !pushed {
			n--
		}
	}
	ts := v.ts
	for i := 0; i < len(ts.fresh) && n > 0; {
		f := ts.fresh[i]
		if !ts.isFresh(f) {
			ts.fresh[i] = ts.fresh[len(ts.fresh)-1]
			ts.fresh = ts.fresh[:len(ts.fresh)-1]
			continue
		}
		if !v.busy([]string{f.key}, inPush) {
			n--
		}
		i++
	}
	return n <= 0
}

// freshSeries is a series pushed once and not yet flushed, when it was
// created (tenantState.fresh).
type freshSeries struct {
	key string
	it  *aggItem
}

// isFresh reports whether f is still held, pushed once, and unflushed.
func (ts *tenantState) isFresh(f freshSeries) bool {
	return ts.Series[f.key] == f.it && f.it.Pushes == 1 && f.it.seq > ts.flushedSeq
}

// flushed notes that the tenant's series up to Seq seq are in its TSDB
// (evictable), and drops what that outdated: fresh series it flushed, and
// the eviction order (Gateway.flushed builds the next).
func (ts *tenantState) flushed(seq uint64) {
	ts.flushedSeq = seq
	if ts.evict != nil && ts.evict.flushedSeq != seq {
		ts.evict = nil
	}
	ts.fresh = slices.DeleteFunc(ts.fresh, func(f freshSeries) bool { return !ts.isFresh(f) })
}
