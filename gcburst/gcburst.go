// Package gcburst keeps the garbage of a known allocation burst from growing
// the heap to the process's GC goal.
//
// The receiver's heap is mostly its TSDB heads, and between bursts it makes
// little garbage, so the Go runtime's goal (live heap × (1 + GOGC/100)) is
// headroom that nothing uses. A head compaction is a burst: TSDB allocates
// ~900 B per head series while it writes the block, nearly all of it garbage,
// fast enough that the heap reaches the goal before a GC runs. At GOGC=70 a
// 1M-series receiver went from 0.8 to 1.5–1.7 GB of RSS at every compaction, and a
// pod's memory limit must be sized for that peak, not for the steady state
// (bench/results/README.md, issue 19). The receiver runs every block write as
// a burst: head cuts and flushes, erasure rewrites, bucket compactions.
//
// Begin lowers GOGC to the burst's percent (SetPercent) until the matching
// end: the GC then runs after every percent % of the live heap allocated,
// and the peak stays near the live heap plus the compaction's own working
// set, for more GC cycles during the burst (a background task every block
// range). Where the burst meets a heavy ingest it buys nothing (the heap
// outgrows a 10 % goal while a GC marks) and slows the ingest: a 1M-series
// catch-up ran at 0.76× while cuts ran back to back (bench/results/README.md):
// see BeginIfQuiet. The setting is process-wide, as GOGC is: bursts nest and
// overlap, and the first Begin saves the process's GOGC that the last end
// restores.
package gcburst

import (
	"context"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultPercent is the GOGC during a burst. At 10 a 1M-series head
// compaction peaked 157 B per series above the live heap instead of 536 B at
// GOGC=70, taking 10.5 s instead of 7.1 s (storage's
// BenchmarkHeadCompactionPeak).
const DefaultPercent = 10

var (
	mu      sync.Mutex
	percent = DefaultPercent
	active  int // bursts begun and not ended; GOGC is the bursts' while > 0
	saved   int // the process's GOGC while active > 0
)

// SetPercent sets the GOGC of later bursts; 0 or less disables them (Begin
// leaves GOGC alone). It does not change a burst in progress.
func SetPercent(p int) {
	mu.Lock()
	defer mu.Unlock()
	percent = p
}

// Begin marks the start of a burst and returns the function that ends it,
// which may be called more than once (later calls do nothing). While any
// burst runs, GOGC is the lower of the process's and the burst's percent
// (the burst's if the process's is off).
func Begin() (end func()) {
	mu.Lock()
	defer mu.Unlock()
	if percent <= 0 {
		return func() {}
	}
	if active == 0 {
		low := percent
		if cur := currentGOGC(); cur >= 0 && cur < percent {
			low = cur
		}
		saved = debug.SetGCPercent(low)
	}
	active++
	if saved < 0 || saved > percent {
		loweredBursts.Add(1)
	} else {
		unchangedBursts.Add(1) // the process's GOGC is already as low
	}
	var once sync.Once
	return func() { once.Do(finish) }
}

func finish() {
	mu.Lock()
	defer mu.Unlock()
	if active--; active == 0 {
		debug.SetGCPercent(saved)
	}
}

// currentGOGC reads the process's GOGC, -1 when off. Reading it with
// debug.SetGCPercent(-1) would turn the GC off for a moment and wait for a
// GC cycle in progress to finish its marking.
func currentGOGC() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[0].Value.Uint64() > math.MaxInt32 {
		return -1 // off is stored as -1 and reads as 2^64-1
	}
	return int(s[0].Value.Uint64())
}

// A burst that meets a busy heap (a catch-up ingesting near the replica's
// limit) lowers no peak and slows the ingest, so the bursts that run beside
// writes (head cuts, bucket compactions and rewrites) use BeginIfQuiet,
// which asks Watch whether the heap was quiet during its last interval.

// quietShare: the heap is quiet when less than this share of the live heap
// was allocated during the last interval (of Watch, and of the receiver's
// release of free heap). A fleet in steady state allocates ~0.1 MB/s against
// ~850 MB of live heap at 1M series, well below 5 % per 10 s; a catch-up or
// a benchmark far more. At 0.25 the release's forced GCs during a
// 1M-series load cost 11–15 % more CPU per sample (bench/results/README.md,
// issue 19).
const quietShare = 0.05

var (
	watching atomic.Bool // Watch is running
	busy     atomic.Bool // its last interval was not quiet
)

// Watch samples the heap every interval until ctx is done, for BeginIfQuiet.
func Watch(ctx context.Context, interval time.Duration) error {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/live:bytes"}}
	read := func() (allocs, live uint64) {
		metrics.Read(s)
		if s[0].Value.Kind() == metrics.KindUint64 && s[1].Value.Kind() == metrics.KindUint64 {
			return s[0].Value.Uint64(), s[1].Value.Uint64()
		}
		return 0, 0
	}
	prev, _ := read()
	watching.Store(true)
	defer watching.Store(false)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur, live := read()
		busy.Store(!QuietHeap(cur-min(prev, cur), live))
		prev = cur
	}
}

// QuietHeap is the receiver's one definition of a quiet heap: allocated
// bytes during an interval against the live heap.
func QuietHeap(allocated, live uint64) bool {
	return float64(allocated) < quietShare*float64(max(live, 1))
}

// BeginIfQuiet is Begin unless Watch runs and found the heap busy during its
// last interval; then GOGC stays as it is and end does nothing. The decision
// holds for the whole burst: a burst's own garbage (~900 MB over 10 s for a
// 1M-series head) makes every heap look busy while it runs, so the heap is
// not watched for a catch-up once the burst has begun.
func BeginIfQuiet() (end func()) {
	if watching.Load() && busy.Load() {
		skippedBusy.Add(1)
		return func() {}
	}
	return Begin()
}
