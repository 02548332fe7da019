// Package gcburst keeps the garbage of a known allocation burst from growing
// the heap to the process's GC goal.
//
// The receiver's heap is mostly its TSDB heads, and between bursts it makes
// little garbage, so the Go runtime's goal (live heap × (1 + GOGC/100)) is
// headroom that nothing uses. A head compaction is a burst: TSDB allocates
// ~900 B per head series while it writes the block, nearly all of it garbage,
// fast enough that the heap reaches the goal before a GC runs. At GOGC=70 a
// 1M-series receiver went from 0.8 to 1.4 GB of RSS at every compaction, and a
// pod's memory limit must be sized for that peak, not for the steady state
// (bench/results/README.md, issue 19). The receiver runs every block write as
// a burst: head cuts and flushes, erasure rewrites, bucket compactions.
//
// Begin lowers GOGC to Percent until the matching end: the GC then runs after
// every Percent % of the live heap allocated, and the peak stays near the live
// heap plus the compaction's own working set, for more GC cycles during the
// burst (a background task every block range). The setting is process-wide,
// as GOGC is: bursts nest and overlap, and the first Begin saves the process's
// GOGC that the last end restores.
package gcburst

import (
	"runtime/debug"
	"sync"
)

// DefaultPercent is the GOGC during a burst. At 10 a 1M-series head
// compaction peaked 143 MB above the live heap instead of 570 MB at GOGC=70,
// taking 11.0 s instead of 7.3 s (storage's BenchmarkHeadCompactionPeak).
const DefaultPercent = 10

var (
	mu      sync.Mutex
	percent = DefaultPercent
	active  int // bursts begun and not ended
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
// which must be called exactly once. While any burst runs, GOGC is the lower
// of the process's and Percent (and Percent if the process's is off).
func Begin() (end func()) {
	mu.Lock()
	defer mu.Unlock()
	if percent <= 0 {
		return func() {}
	}
	if active == 0 {
		saved = debug.SetGCPercent(-1) // read it; set below
		lower := saved
		if saved < 0 || percent < saved {
			lower = percent
		}
		debug.SetGCPercent(lower)
	}
	active++
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
