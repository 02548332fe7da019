package main

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestShouldRelease(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name      string
		prev, cur heapSample
		want      bool
	}{
		{"quiet heap with much free: release", heapSample{allocs: 1000 * mib}, heapSample{free: 200 * mib, objects: 800 * mib, live: 800 * mib, allocs: 1010 * mib}, true},
		{"quiet heap with much uncollected garbage: release", heapSample{allocs: 1000 * mib}, heapSample{free: 10 * mib, objects: 950 * mib, live: 800 * mib, allocs: 1010 * mib}, true},
		{"free below the minimum", heapSample{}, heapSample{free: 6 * mib, objects: 50 * mib, live: 50 * mib}, false},
		{"free and garbage below 5% of the heap", heapSample{}, heapSample{free: 35 * mib, objects: 830 * mib, live: 800 * mib}, false},
		{"free above 5% of a small heap and the minimum", heapSample{}, heapSample{free: 9 * mib, objects: 100 * mib, live: 100 * mib}, true},
		{"busy heap: the free pages are about to be reused", heapSample{allocs: 0}, heapSample{free: 200 * mib, objects: 800 * mib, live: 800 * mib, allocs: 50 * mib}, false},
		{"counter reset (cannot happen) counts as quiet", heapSample{allocs: 500 * mib}, heapSample{free: 200 * mib, objects: 800 * mib, live: 800 * mib, allocs: 10 * mib}, true},
	} {
		if got := shouldRelease(tc.prev, tc.cur); got != tc.want {
			t.Errorf("%s: shouldRelease = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The metrics the check reads exist in this Go version.
func TestHeapMetricsExist(t *testing.T) {
	known := map[string]bool{}
	for _, d := range metrics.All() {
		known[d.Name] = true
	}
	for _, n := range heapMetrics {
		if !known[n] {
			t.Errorf("runtime/metrics has no %s", n)
		}
	}
}

// A garbage burst leaves free heap; a quiet interval later it is returned.
func TestReleaseFreeHeapReturnsBurst(t *testing.T) {
	s := make([]metrics.Sample, len(heapMetrics))
	for i, n := range heapMetrics {
		s[i].Name = n
	}
	keep := make([][]byte, 0, 64)
	for range 64 {
		keep = append(keep, make([]byte, 1<<20)) // 64 MiB live
	}
	for range 200 {
		_ = make([]byte, 1<<20) // garbage
	}
	// Collected now: until a GC runs the garbage is heap in use, not free
	// heap, so the poll below could see little free heap before the burst
	// is freed, and a GC right after it would make it (CI saw 32 MiB).
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- releaseFreeHeap(ctx, slog.New(slog.DiscardHandler), 50*time.Millisecond) }()
	// Long enough for a loaded -race CI (the loop ends as soon as it is
	// returned), short of the test binary's own deadline.
	deadline := time.Now().Add(time.Minute)
	if d, ok := t.Deadline(); ok && d.Before(deadline) {
		deadline = d.Add(-time.Until(d) / 2)
	}
	for time.Now().Before(deadline) {
		if h := readHeap(s); h.free < releaseMinFree {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h := readHeap(s); h.free >= releaseMinFree {
		t.Errorf("free heap %d B after a quiet interval, want < %d", h.free, releaseMinFree)
	}
	_ = keep[0]
}
