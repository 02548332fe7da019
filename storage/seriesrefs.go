package storage

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	promstorage "github.com/prometheus/prometheus/storage"

	"github.com/phonehome/phonehome/labelhash"
)

// seriesRefs maps a hash of a series' labels to its TSDB head reference, for
// writers that do not keep the references themselves (WriteHinted: the
// receiver's remote-write path keeps them in the limiter's series entries,
// so this map stays empty there). A
// telemetry fleet appends one point at a time to the same series, so with
// the reference an append skips building the series' labels.Labels and the
// head's own lookup (labels hash, map, label comparison): about a third of
// the write path's CPU.
//
// The key is 128 bits (two independent hashes, one seeded), so two series
// sharing a key is not a practical concern (~n²/2¹²⁹). An entry can go stale
// when the head drops its series after a compaction: TSDB then refuses the
// reference, the writer looks the series up by its labels instead and
// corrects the entry, and the whole map is dropped each time the head is
// truncated, so series that left do not pile up.
//
// It also holds the symbol table that new series' labels are built with.
// In a receiver built with the dedupelabels tag (the Makefile's
// RECEIVER_TAGS), a head series' labels are then a few bytes of references
// into that table instead of a copy of every name and value: the fleet's
// names, versions, namespaces and cluster IDs repeat across thousands of
// series, and this saves about 300 bytes of ~1.5 KB per series. Other builds ignore the table. It is
// replaced at each head truncation, as the map is, so strings of series that
// left do not pile up either; TSDB moves the series it keeps to a table of
// its own when it compacts (Head.RebuildSymbolTable).
type seriesRefs struct {
	seed    maphash.Seed
	headMin atomic.Int64 // the head's min time when last synced
	shards  [refShards]refShard
	symbols atomic.Pointer[labels.SymbolTable]
	// building serialises label building on the shared table: Prometheus'
	// ScratchBuilder.Labels reads the table's name slice unlocked while
	// another build may be growing it (a data race once a table passes
	// 1,024 strings). It is only taken for new series and exemplars.
	building sync.Mutex
}

const refShards = 32

type refShard struct {
	mu sync.RWMutex
	m  map[seriesKey]promstorage.SeriesRef
}

type seriesKey [2]uint64

func newSeriesRefs() *seriesRefs {
	r := &seriesRefs{seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].m = map[seriesKey]promstorage.SeriesRef{}
	}
	r.symbols.Store(labels.NewSymbolTable())
	return r
}

// key is 128 bits of two independent hashes of ls: the seeded one keeps
// anyone from crafting a collision, the unseeded one is the cheaper half.
func (r *seriesRefs) key(ls []prompb.Label) seriesKey {
	return seriesKey{labelhash.Unseeded(ls), labelhash.Seeded(r.seed, ls)}
}

func (r *seriesRefs) shard(k seriesKey) *refShard { return &r.shards[k[0]%refShards] }

// get returns the reference of the series with key k, or 0.
func (r *seriesRefs) get(k seriesKey) promstorage.SeriesRef {
	s := r.shard(k)
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[k]
}

func (r *seriesRefs) put(k seriesKey, ref promstorage.SeriesRef) {
	s := r.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[k] = ref
}

// labelsBuilder returns a builder for new series' labels, which interns
// their strings in the current symbol table. Build with build.
func (r *seriesRefs) labelsBuilder() labels.ScratchBuilder {
	return labels.NewScratchBuilderWithSymbolTable(r.symbols.Load(), 0)
}

// build runs fn, which builds labels with a labelsBuilder, alone.
func (r *seriesRefs) build(fn func()) {
	r.building.Lock()
	defer r.building.Unlock()
	fn()
}

// sync drops every entry and the symbol table once the head has been
// truncated since they were added: its min time moved forward. Older
// samples appended to the head lower it without dropping anything, and an
// empty head's is math.MaxInt64.
func (r *seriesRefs) sync(headMin int64) {
	old := r.headMin.Load()
	if old == headMin || headMin == math.MaxInt64 || !r.headMin.CompareAndSwap(old, headMin) || headMin < old {
		return
	}
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		s.m = map[seriesKey]promstorage.SeriesRef{} // clear would keep the peak's buckets
		s.mu.Unlock()
	}
	r.symbols.Store(labels.NewSymbolTable())
}
