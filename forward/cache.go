package forward

import (
	"hash/maphash"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
)

// symbols interns label names and values across cycles and hands out the
// compact, per-request symbol references of remote-write 2.0. Interning once
// turns the per-series symbolization of a request into slice lookups instead
// of a string hash per label name and value. Not safe for concurrent use.
type symbols struct {
	strs []string          // by id; strs[0] == ""
	ids  map[string]uint32 // inverse of strs

	// The request being built: gen stamps the ids that have a ref in it.
	gen     uint32
	reqGen  []uint32 // by id
	reqRef  []uint32 // by id; valid where reqGen[id] == gen
	reqSyms []string // the request's symbol list; reqSyms[0] == ""
}

func newSymbols() *symbols {
	t := &symbols{ids: map[string]uint32{"": 0}, strs: []string{""}, reqGen: []uint32{0}, reqRef: []uint32{0}}
	t.startRequest()
	return t
}

// intern returns s's id, adding it if needed.
func (t *symbols) intern(s string) uint32 {
	if id, ok := t.ids[s]; ok {
		return id
	}
	id := uint32(len(t.strs))
	s = strings.Clone(s) // not the whole label set s may be part of
	t.strs = append(t.strs, s)
	t.ids[s] = id
	t.reqGen = append(t.reqGen, 0)
	t.reqRef = append(t.reqRef, 0)
	return id
}

// ref returns the reference of the interned id in the current request,
// adding the symbol to the request if needed. "" is always 0.
func (t *symbols) ref(id uint32) uint32 {
	if id == 0 {
		return 0
	}
	if t.reqGen[id] == t.gen {
		return t.reqRef[id]
	}
	r := uint32(len(t.reqSyms))
	t.reqSyms = append(t.reqSyms, t.strs[id])
	t.reqGen[id], t.reqRef[id] = t.gen, r
	return r
}

// startRequest forgets the current request's symbols.
func (t *symbols) startRequest() {
	clear(t.reqSyms)
	t.reqSyms = append(t.reqSyms[:0], "")
	t.gen++
	if t.gen == 0 { // wrapped: stamps of 2^32 requests ago would look current
		clear(t.reqGen)
		t.gen = 1
	}
}

// len is the number of interned strings.
func (t *symbols) len() int { return len(t.strs) }

// internLabels appends the ids of ls's names and values to ids.
func (t *symbols) internLabels(ls labels.Labels, ids []uint32) []uint32 {
	ls.Range(func(l labels.Label) { ids = append(ids, t.intern(l.Name), t.intern(l.Value)) })
	return ids
}

// seriesCache remembers, per federated series, everything a cycle decides
// about it from its labels alone: whether the allowlist selects it, which of
// the policy's caps select it, whether relabeling keeps it, and its
// relabeled and anonymized labels as interned symbols. The same series come
// back every cycle, so a steady-state cycle neither parses their labels
// (Prometheus' scrape cache does the same with the raw series bytes) nor
// re-runs the allowlist, relabel_configs and HMACs.
//
// Entries are keyed by a 128-bit hash of Sample.key (which identifies the
// labels exactly: the parser's series bytes, where the protobuf parser
// separates names and values with 0xff, a byte valid UTF-8 label values
// cannot contain), from two maphash seeds drawn at random per process.
// Keeping the keys themselves (the series' exposition text) would make the
// cache exact but about three times as large: +65 MiB of RSS at 100k series
// in BenchmarkCycle. The chance that any two of n series collide is below
// n²/2^129, 1.5e-29 for 100k; without the seeds, which never leave the
// process, label values cannot be chosen to collide. A collision would give
// a series another series' verdict and relabeled labels, never raw values.
// All entries and symbols are computed under one
// Policy and dropped as a whole when another is in force. The cache holds at
// most max series; beyond that series are processed without it. Series not
// seen in a complete cycle are evicted at its end, and the symbols are
// rebuilt when they outgrow what the live entries can use. Not safe for
// concurrent use (Collect does not overlap).
type seriesCache struct {
	max     int // entries; 0 disables the cache
	pol     *Policy
	entries map[seriesKey]*cachedSeries
	seeds   [2]maphash.Seed
	syms    *symbols
	cycle   uint64
	seen    int // entries seen in this cycle
}

// cachedSeries is what a policy makes of one federated series.
type cachedSeries struct {
	name string // the federated metric name (to find the family's metadata)
	drop string // "" (kept), ReasonAllowlist or ReasonRelabel
	caps []int  // indices of the policy's caps whose selectors match, if allowed
	refs []uint32
	seen uint64 // the last cycle that had the series
}

func newSeriesCache(maxSeries int) *seriesCache {
	return &seriesCache{
		max: maxSeries, entries: map[seriesKey]*cachedSeries{}, syms: newSymbols(),
		seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
	}
}

// symbolsPerSeries bounds the symbols kept per cached series before the
// symbol table is rebuilt (a series has a few dozen names and values, most
// shared with other series).
const symbolsPerSeries = 8

// begin starts a cycle under pol.
func (c *seriesCache) begin(pol *Policy) {
	if pol != c.pol || c.syms.len() > symbolsPerSeries*max(c.max, len(c.entries))+4096 {
		c.reset()
		c.pol = pol
	}
	c.cycle++
	c.seen = 0
}

func (c *seriesCache) reset() {
	clear(c.entries)
	c.syms = newSymbols()
}

// get returns the entry of k, marking it seen in this cycle.
func (c *seriesCache) get(k seriesKey) *cachedSeries {
	e := c.entries[k]
	if e != nil && e.seen != c.cycle {
		e.seen = c.cycle
		c.seen++
	}
	return e
}

// put stores a copy of e, a series named name, under k if there is room,
// and returns the copy (nil if there was no room).
func (c *seriesCache) put(k seriesKey, e *cachedSeries, name string) *cachedSeries {
	if len(c.entries) >= c.max {
		return nil
	}
	cp := &cachedSeries{name: strings.Clone(name), drop: e.drop, seen: c.cycle}
	if len(e.caps) > 0 {
		cp.caps = slices.Clone(e.caps)
	}
	if len(e.refs) > 0 {
		cp.refs = slices.Clone(e.refs)
	}
	c.seen++
	c.entries[k] = cp
	return cp
}

// seriesKey is a 128-bit hash of a Sample.key.
type seriesKey struct{ a, b uint64 }

// key returns the cache key of a Sample.key.
func (c *seriesCache) key(key []byte) seriesKey {
	return seriesKey{maphash.Bytes(c.seeds[0], key), maphash.Bytes(c.seeds[1], key)}
}

// end finishes a cycle; a complete one evicts the series it did not see.
func (c *seriesCache) end(complete bool) {
	if !complete || c.seen == len(c.entries) {
		return
	}
	for k, e := range c.entries {
		if e.seen != c.cycle {
			delete(c.entries, k)
		}
	}
}
