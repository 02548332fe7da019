package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/prometheus/tsdb"
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
// So TSDB's automatic compaction is off and the DB cuts head blocks itself,
// one block range at a time, each behind a barrier: it takes lifecycle for
// writing, which waits for every write in flight (each holds it for reading
// from its first append to its commit), and reads the range while no write
// runs. A write that starts after the barrier sees a compactable head, and
// TSDB refuses its samples below max time − block/2 (appendableMinValidTime),
// which is past the end of the range because the head is compactable: its
// span exceeds 1.5 blocks. The barrier costs writes one wait for the
// slowest write in flight, once per block range (every 2 h).

// compactCheckInterval is how often heads are checked besides the signal a
// write sends when its commit made the head compactable (TSDB checks every
// minute and after each commit, too).
const compactCheckInterval = time.Minute

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
func (db *DB) stopCompactions() {
	db.stopCompactOnce.Do(func() { close(db.stopCompact) })
	<-db.compactDone
}

func (db *DB) compactHeads() {
	for _, t := range db.snapshotTenants() {
		if err := db.compactTenant(t); err != nil {
			db.m.compactionFailures.Inc()
			db.logger.Error("head compaction failed, will retry", "tenant", t.name, "err", err)
		}
	}
}

// compactTenant cuts every block range the head of t holds beyond 1.5
// blocks, as TSDB's Compact would, then compacts the out-of-order head (as
// Compact does after cutting a block).
func (db *DB) compactTenant(t *tenant) error {
	db.compactMtx.Lock() // EraseLocal closes and reopens tenants
	defer db.compactMtx.Unlock()
	var cut bool
	for {
		tdb, mint, maxt, ok := db.nextHeadRange(t.name)
		if !ok {
			break
		}
		// [mint, maxt): block ranges are half-open, chunk ranges closed.
		if err := tdb.CompactHead(tsdb.NewRangeHead(tdb.Head(), mint, maxt-1)); err != nil {
			return fmt.Errorf("compact head: %w", err)
		}
		cut = true
	}
	if !cut {
		return nil
	}
	cur, release, err := db.readTenant(t.name)
	if errors.Is(err, ErrNotReady) || cur == nil {
		return nil // closing: Close flushes the whole head
	}
	if err != nil {
		return err
	}
	defer release()
	if err := cur.db.CompactOOOHead(context.Background()); err != nil {
		return fmt.Errorf("compact out-of-order head: %w", err)
	}
	return nil
}

// nextHeadRange returns the tenant's TSDB and the block range its head holds
// that is ready to be cut, if any, read behind the barrier (see above).
func (db *DB) nextHeadRange(name string) (tdb *tsdb.DB, mint, maxt int64, ok bool) {
	blockMs := time.Duration(db.cfg.BlockDuration).Milliseconds()
	if t := db.tenant(name); t == nil || !headCompactable(t.db.Head(), blockMs) {
		return nil, 0, 0, false // the common case: no barrier
	}
	db.lifecycle.Lock()
	defer db.lifecycle.Unlock()
	t := db.tenant(name)
	if db.closed || t == nil || !headCompactable(t.db.Head(), blockMs) {
		return nil, 0, 0, false
	}
	mint = t.db.Head().MinTime()
	return t.db, mint, mint - mod(mint, blockMs) + blockMs, true
}

// headCompactable is TSDB's Head.compactable: the head spans more than 1.5
// block ranges, so its first range lies before every valid append.
func headCompactable(h *tsdb.Head, blockMs int64) bool {
	mint, maxt := h.MinTime(), h.MaxTime()
	return mint <= maxt && maxt-mint > blockMs/2*3
}
