package gcburst

import (
	"context"
	"runtime/debug"
	"testing"
	"time"
)

func gogc() int { return currentGOGC() }

// withGOGC runs the test body with the process's GOGC at p and Percent at
// burst, and restores both.
func withGOGC(t *testing.T, p, burst int) {
	t.Helper()
	old := debug.SetGCPercent(p)
	SetPercent(burst)
	t.Cleanup(func() {
		debug.SetGCPercent(old)
		SetPercent(DefaultPercent)
	})
}

func TestBeginLowersGOGCUntilEnd(t *testing.T) {
	withGOGC(t, 70, 10)
	end := Begin()
	if got := gogc(); got != 10 {
		t.Fatalf("GOGC during a burst = %d, want 10", got)
	}
	end()
	if got := gogc(); got != 70 {
		t.Fatalf("GOGC after the burst = %d, want 70 restored", got)
	}
	end() // a second call is a no-op, not a second end
	if got := gogc(); got != 70 {
		t.Fatalf("GOGC after ending twice = %d, want 70", got)
	}
}

func TestOverlappingBurstsRestoreOnceAllEnd(t *testing.T) {
	withGOGC(t, 70, 10)
	end1 := Begin()
	end2 := Begin()
	end1()
	if got := gogc(); got != 10 {
		t.Fatalf("GOGC with one burst still running = %d, want 10", got)
	}
	end2()
	if got := gogc(); got != 70 {
		t.Fatalf("GOGC after both bursts = %d, want 70", got)
	}
}

func TestBeginKeepsALowerGOGC(t *testing.T) {
	withGOGC(t, 5, 10)
	end := Begin()
	defer end()
	if got := gogc(); got != 5 {
		t.Fatalf("GOGC during a burst = %d, want the process's lower 5", got)
	}
}

func TestBeginWithGOGCOff(t *testing.T) {
	withGOGC(t, -1, 10) // GOGC=off: the memory limit alone drives the GC
	end := Begin()
	if got := gogc(); got != 10 {
		t.Fatalf("GOGC during a burst = %d, want 10", got)
	}
	end()
	if got := gogc(); got != -1 {
		t.Fatalf("GOGC after the burst = %d, want off (-1) restored", got)
	}
}

func TestDisabled(t *testing.T) {
	withGOGC(t, 70, 0)
	end := Begin()
	if got := gogc(); got != 70 {
		t.Fatalf("GOGC during a disabled burst = %d, want 70 untouched", got)
	}
	end()
	if got := gogc(); got != 70 {
		t.Fatalf("GOGC after a disabled burst = %d, want 70", got)
	}
}

func TestQuietHeap(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		allocated, live uint64
		want            bool
	}{
		{1 * mib, 800 * mib, true},    // a fleet in steady state: ~0.1 MB/s
		{39 * mib, 800 * mib, true},   // just under 5 %
		{41 * mib, 800 * mib, false},  // just over
		{900 * mib, 800 * mib, false}, // a catch-up, or a burst in progress
		{0, 0, true},
	} {
		if got := QuietHeap(tc.allocated, tc.live); got != tc.want {
			t.Errorf("QuietHeap(%d MiB, %d MiB) = %v, want %v", tc.allocated/mib, tc.live/mib, got, tc.want)
		}
	}
}

func TestBeginIfQuiet(t *testing.T) {
	withGOGC(t, 70, 10)
	t.Cleanup(func() { watching.Store(false); busy.Store(false) })
	for _, tc := range []struct {
		name           string
		watching, busy bool
		want           int
	}{
		{"no watch (tests, the erase command): a burst", false, true, 10},
		{"quiet heap: a burst", true, false, 10},
		{"busy heap: no burst", true, true, 70},
	} {
		watching.Store(tc.watching)
		busy.Store(tc.busy)
		end := BeginIfQuiet()
		if got := gogc(); got != tc.want {
			t.Errorf("%s: GOGC = %d, want %d", tc.name, got, tc.want)
		}
		end()
		if got := gogc(); got != 70 {
			t.Errorf("%s: GOGC after end = %d, want 70", tc.name, got)
		}
	}
}

// A burst from BeginIfQuiet keeps GOGC low to its end, however busy the
// heap turns meanwhile: its own garbage makes it busy.
func TestQuietBurstHoldsToItsEnd(t *testing.T) {
	withGOGC(t, 70, 10)
	watching.Store(true)
	t.Cleanup(func() { watching.Store(false); busy.Store(false) })
	end := BeginIfQuiet()
	busy.Store(true)
	if got := gogc(); got != 10 {
		t.Fatalf("GOGC of a quiet burst once the heap is busy = %d, want 10", got)
	}
	end()
	if got := gogc(); got != 70 {
		t.Fatalf("GOGC after the burst = %d, want 70", got)
	}
}

// Watch marks a heap busy after an interval with much allocated, and stops
// watching when its context ends.
func TestWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- Watch(ctx, 20*time.Millisecond) }()
	deadline := time.Now().Add(10 * time.Second)
	var sink [][]byte
	for !watching.Load() || !busy.Load() {
		if time.Now().After(deadline) {
			t.Fatal("Watch did not find a heap busy that allocated far more than 5 % of itself per interval")
		}
		for range 64 {
			sink = append(sink, make([]byte, 1<<20))
		}
		sink = sink[:0]
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if watching.Load() {
		t.Fatal("still watching after Watch returned")
	}
	busy.Store(false)
}
