package main

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/phonehome/phonehome/gcburst"
)

// Returning free heap to the OS once a burst is over.
//
// The receiver's heap is mostly the TSDB head, which lives as long as its
// series; its ingest path makes almost no garbage. Bursts do: creating
// series (a fleet's first scrape, a catch-up), the head compaction every 2h.
// After one, the Go runtime keeps the freed heap mapped for reuse (its
// scavenger returns only what exceeds ~110 % of the GC goal, live × 1.7 at
// GOGC=70), so the RSS stays at the burst's peak while the live heap is well
// below it: 100–400 B per series in bench/results/README.md's issue 19 runs,
// 10–30 % of the RSS.
//
// Most of what a burst leaves is not even free heap yet: it is garbage that
// no GC collects, because a quiet heap does not reach the GC goal (the
// runtime forces a GC only every 2 minutes, and then returns the pages
// slowly). releaseFreeHeap checks every interval and, when the heap is quiet
// (little was allocated during the last interval, so freed pages would not
// be reused soon) and either the free heap or the heap beyond the live heap
// of the last GC (garbage) is large, runs debug.FreeOSMemory: a GC, then all
// free pages back to the OS. A receiver with a busy heap (allocating a good
// share of its size per interval) is left to the runtime, as before.

const (
	// releaseMinFree is the free heap below which nothing is released.
	releaseMinFree = 8 << 20
	// releaseFreeShare: release when the free heap, or the heap's objects
	// beyond the live heap of the last GC, exceed this share of the live heap...
	// At 0.10 (and a 32 MiB minimum) a 200k-series receiver kept the burst
	// in one of two runs (1,220 B per series instead of 1,075); at 0.05 the
	// RSS per series after a load repeated within 1 % at 200k and 1M series,
	// at the same CPU per sample (bench/results/README.md, issue 19). In a
	// quiet steady state each release is a GC of the live heap per 5 % of it
	// allocated: at a fleet's ~0.1 MB/s, one every few minutes.
	releaseFreeShare = 0.05
)

// heapSample is what one check reads.
type heapSample struct {
	free    uint64 // free heap not yet returned to the OS
	objects uint64 // heap occupied by objects (live and garbage not yet collected)
	live    uint64 // live heap as of the last GC
	allocs  uint64 // cumulative bytes allocated
}

var heapMetrics = []string{
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
	"/gc/heap/live:bytes",
	"/gc/heap/allocs:bytes",
}

func readHeap(s []metrics.Sample) heapSample {
	metrics.Read(s)
	var h heapSample
	for i, p := range []*uint64{&h.free, &h.objects, &h.live, &h.allocs} {
		if s[i].Value.Kind() == metrics.KindUint64 {
			*p = s[i].Value.Uint64()
		}
	}
	return h
}

// shouldRelease decides from the previous and the current sample.
func shouldRelease(prev, cur heapSample) bool {
	live := max(cur.live, 1)
	garbage := cur.objects - min(cur.live, cur.objects)
	large := func(b uint64) bool { return b >= releaseMinFree && float64(b) >= releaseFreeShare*float64(live) }
	if !large(cur.free) && !large(garbage) {
		return false
	}
	// ...and the heap is quiet: a catch-up or a benchmark is left alone
	// until it is over (gcburst.QuietHeap).
	return gcburst.QuietHeap(cur.allocs-min(prev.allocs, cur.allocs), cur.live)
}

// releaseFreeHeap runs the check every interval until ctx is done.
func releaseFreeHeap(ctx context.Context, logger *slog.Logger, interval time.Duration) error {
	s := make([]metrics.Sample, len(heapMetrics))
	for i, n := range heapMetrics {
		s[i].Name = n
	}
	prev := readHeap(s)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur := readHeap(s)
		if shouldRelease(prev, cur) {
			start := time.Now()
			debug.FreeOSMemory()
			logger.Debug("returned free heap to the OS", "free_bytes", cur.free, "heap_object_bytes", cur.objects, "took", time.Since(start))
			cur = readHeap(s)
		}
		prev = cur
	}
}
