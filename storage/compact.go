package storage

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/prometheus/tsdb"

	"github.com/phonehome/phonehome/gcburst"
)

// Head compaction.
//
// Tenant TSDBs run with isolation disabled: its per-series ring of append
// ids is ~65 B of every head series (issue 19, bench/results/README.md), and
// remote-write requests are no transactions a reader could wait for anyway
// (Cortex and Mimir run TSDB the same way). Isolation is also what TSDB's own
// compaction uses to wait for appenders that overlap the range it cuts into
// a block (Head.WaitForAppendersOverlapping reads the isolation state); with
// it off, an append opened before the head became compactable could land in
// a range already written to a block, and then be truncated from the head:
// lost after its acknowledgement.
//
// So TSDB's automatic compaction is off and the DB cuts head blocks itself.
// A round first reads, behind a barrier, the max time of every head that is
// ready to be cut: it takes lifecycle for writing, which waits for every
// write in flight (each holds it for reading from its first append to its
// commit), reads, and lets writes go on at once. Then it cuts, outside the
// barrier, every block range that ends more than half a block before the
// max time read. A write that started after the barrier computed its minimum
// valid time from a head at least that late (TSDB's appendableMinValidTime:
// max time − block/2), which is past the end of every range cut, and the
// writes from before the barrier are over. Samples older than that go to the
// out-of-order head, which the round compacts after cutting, as TSDB's
// Compact does. The barrier costs writes one wait for the slowest write in
// flight, once per round that has something to cut (every 2h).
//
// Every block write of the package runs as a GC burst (package gcburst):
// flushHead (at shutdown and erasure, with writes stopped) always, a round's
// cuts and RewriteBlock when the heap is quiet (no catch-up running). TSDB
// allocates ~900 B of garbage per head series while it writes a block, which
// would otherwise grow the heap to the process's GC goal, ~1.7× the live heap.

const (
	// compactCheckInterval is how often heads are checked besides the
	// signal a write sends when its commit made the head compactable (TSDB
	// checks every minute and after each commit, too).
	compactCheckInterval = time.Minute
	// A tenant whose compaction failed is retried after a wait doubling from
	// compactBackoffMin to compactBackoffMax, as TSDB's run loop does: on a
	// full disk each attempt writes a whole block and stalls writes at the
	// barrier.
	compactBackoffMin = time.Second
	compactBackoffMax = time.Minute
)

// beginGCBurst and beginGCBurstIfQuiet are gcburst's; tests replace them
// to see what runs under them.
var (
	beginGCBurst        = gcburst.Begin
	beginGCBurstIfQuiet = gcburst.BeginIfQuiet
)

// retries holds the tenants whose last cut failed: when each may be tried
// again, and its current wait. Guarded by compactMtx.
type retries map[string]retry

type retry struct {
	wait time.Duration
	next time.Time
}

// waiting reports whether name failed and its wait is not over at now.
func (r retries) waiting(name string, now time.Time) bool {
	b, ok := r[name]
	return ok && now.Before(b.next)
}

// failed records a failure of name at now and returns the wait before the
// next try: compactBackoffMin, doubling with each failure in a row up to
// compactBackoffMax.
func (r retries) failed(name string, now time.Time) time.Duration {
	b := r[name]
	b.wait = min(max(2*b.wait, compactBackoffMin), compactBackoffMax)
	b.next = now.Add(b.wait)
	r[name] = b
	return b.wait
}

// succeeded forgets the failures of name.
func (r retries) succeeded(name string) { delete(r, name) }

// runCompactions compacts heads when signalled and every
// compactCheckInterval, until db.stopCompact is closed.
func (db *DB) runCompactions() {
	defer close(db.compactDone)
	tick := time.NewTicker(compactCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-db.stopCompact:
			return
		case <-db.compactNow:
		case <-tick.C:
		}
		db.compactHeads()
	}
}

// signalCompaction asks runCompactions for a round without waiting.
func (db *DB) signalCompaction() {
	select {
	case db.compactNow <- struct{}{}:
	default:
	}
}

// stopCompactions ends runCompactions and waits for its round to finish.
// Close calls it after refusing new writes; the round's tenants stay open
// until it returns.
func (db *DB) stopCompactions() {
	db.stopCompactOnce.Do(func() { close(db.stopCompact) })
	<-db.compactDone
}

// compactHeads runs one round over the tenants whose heads are ready.
func (db *DB) compactHeads() {
	db.compactMtx.Lock() // EraseLocal closes and reopens tenants
	defer db.compactMtx.Unlock()
	blockMs := db.blockMs()
	now := time.Now()
	var due []*tenant
	for _, t := range db.snapshotTenants() {
		if db.compactRetries.waiting(t.name, now) {
			continue
		}
		if headCompactable(t.db.Head(), blockMs) {
			due = append(due, t)
		}
	}
	if len(due) == 0 {
		return // the common case: no barrier
	}
	maxts, ok := db.headMaxTimes(due)
	if !ok {
		return // closing: Close flushes the whole head
	}
	defer beginGCBurstIfQuiet()() // writes go on meanwhile
	for i, t := range due {
		start := time.Now()
		err := db.cutHead(t, maxts[i], blockMs)
		if err == nil {
			db.compactRetries.succeeded(t.name)
			if took := time.Since(start); took.Milliseconds() > blockMs {
				db.logger.Warn("head compaction took longer than a block range: compactions are falling behind", "tenant", t.name, "took", took)
			}
			continue
		}
		db.m.compactionFailures.Inc()
		wait := db.compactRetries.failed(t.name, time.Now())
		db.logger.Error("head compaction failed", "tenant", t.name, "retry_in", wait, "err", err)
	}
}

// headMaxTimes reads the head max time of every tenant in ts behind the
// barrier (see above); false if the DB is closing.
func (db *DB) headMaxTimes(ts []*tenant) ([]int64, bool) {
	db.lifecycle.Lock()
	defer db.lifecycle.Unlock()
	if db.closed {
		return nil, false
	}
	maxts := make([]int64, len(ts))
	for i, t := range ts {
		maxts[i] = t.db.Head().MaxTime()
	}
	return maxts, true
}

// cutHead cuts every block range of t's head that ends at least half a
// block before maxt, the head's max time read behind the barrier, then
// compacts the out-of-order head if it cut anything.
func (db *DB) cutHead(t *tenant, maxt, blockMs int64) error {
	var cut bool
	for {
		h := t.db.Head()
		mint := h.MinTime()
		if mint > h.MaxTime() || maxt-mint <= blockMs/2*3 {
			break
		}
		end := mint - mod(mint, blockMs) + blockMs // ≤ mint + block < maxt − block/2
		// [mint, end): block ranges are half-open, chunk ranges closed.
		if err := t.db.CompactHead(tsdb.NewRangeHead(h, mint, end-1)); err != nil {
			return fmt.Errorf("compact head: %w", err)
		}
		cut = true
	}
	if !cut {
		return nil
	}
	if err := t.db.CompactOOOHead(context.Background()); err != nil {
		return fmt.Errorf("compact out-of-order head: %w", err)
	}
	return nil
}

// headCompactable is TSDB's Head.compactable: the head spans more than 1.5
// block ranges, so its first range lies before every valid append.
func headCompactable(h *tsdb.Head, blockMs int64) bool {
	mint, maxt := h.MinTime(), h.MaxTime()
	return mint <= maxt && maxt-mint > blockMs/2*3
}
