package gcburst

import (
	"runtime/debug"
	"testing"
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
