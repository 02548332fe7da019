package push

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/phonehome/phonehome/atomicfile"
)

// A flush's compaction holds the Gateway's mutex only to copy the state and
// to install the snapshot: encoding and writing it (300-640 ms at 100k
// series on a loaded 2-core box, every push and read waiting) happen
// without it, while pushes go on appending to the log. At 100k series the
// copy (with the expiry scan) holds the mutex ~6 ms, the install ~3 ms plus
// the rewrite of the records pushed meanwhile (push/testdata/
// bench-evict-flush.txt). The steps, and what a crash after each leaves (the
// numbers are the invariants at the top of state.go):
//
//   - begin (mutex held, no record pending): the state is copied at Seq S
//     (its maps cloned; the series' items are shared, as a push replaces
//     those it changes: aggItem); the log's bytes so far hold the records up
//     to S, and the records appended from now on are kept aside too
//     (durableLog.tail). A crash: the old snapshot and the whole log, as
//     before the flush.
//   - write (no mutex): the snapshot is encoded, written and fsynced under a
//     temporary name. A crash: as above, and a stray temporary file.
//   - install (mutex held, no record pending: the records since begin are
//     all acknowledged): unless the log was reset meanwhile, the snapshot is
//     renamed into place and the directory fsynced. A crash: the snapshot
//     at S and the whole log, whose records up to S replay skips (4).
//   - then the log drops the records up to S: it is truncated if none was
//     appended since begin, else replaced by a file holding exactly those
//     (written and fsynced under a temporary name, renamed, the directory
//     fsynced). A crash: either log, each agreeing with the snapshot (2).
//
// A reset during the write (an fsync failed) writes a snapshot of its own,
// newer, and empties the log: the compaction is then void (errSuperseded),
// or its older snapshot would replace the reset's while the records between
// the two are in neither. Erase cannot run during it (Gateway.flushMu).

// errSuperseded means a compaction was not installed because the log was
// reset since it began, with a newer snapshot.
var errSuperseded = errors.New("push log rewritten since the compaction began")

// flushStep names the points between a flush's steps (Gateway.flushStep,
// a test seam: kill points, pauses).
type flushStep int

const (
	stepCopied    flushStep = iota // the state is copied; the mutex is free
	stepEncoded                    // the snapshot is encoded, not yet written
	stepPrepared                   // the snapshot is written and fsynced, not in place
	stepInstalled                  // the snapshot is in place, the log not cut (mutex held)
	stepCut                        // the log holds the records after the snapshot only (mutex held)
)

// compaction is a flush's snapshot of the state at Seq snap.Seq, written
// without the Gateway's mutex (write) and installed with it (install).
type compaction struct {
	snap  *snapshot
	gen   uint64 // the log's generation at begin (reset bumps it)
	start int64  // the log's size at begin: its records up to snap.Seq
	file  *atomicfile.Prepared
	step  func(flushStep)
}

// begin starts a compaction of the state as copied now, at the log's last
// Seq (the caller sets snap), and keeps what is appended from now on
// (tail). Called with the Gateway's mutex held and no record pending.
func (l *durableLog) begin(step func(flushStep)) *compaction {
	l.tail = []byte{}
	return &compaction{gen: l.gen, start: l.size, step: step}
}

// write encodes the snapshot and writes it under a temporary name. It reads
// the compaction only: called without the Gateway's mutex.
func (c *compaction) write(dir string) error {
	b, err := c.snap.encode()
	if err != nil {
		return err
	}
	c.step(stepEncoded)
	if c.file, err = atomicfile.Prepare(filepath.Join(dir, snapshotFile), b, 0o640); err != nil {
		return fmt.Errorf("write push snapshot: %w", err)
	}
	c.step(stepPrepared)
	return nil
}

// abandon ends a compaction that is not to be installed.
func (l *durableLog) abandon(c *compaction) {
	l.tail = nil
	if c.file != nil {
		_ = c.file.Discard()
	}
}

// install puts the written snapshot in place and drops from the log the
// records it holds, unless the log was reset since begin (errSuperseded).
// Called with the Gateway's mutex held and no record pending, so that the
// records kept are acknowledged ones (those refused reset the log). An
// error wrapping errRewind means the log's file is in doubt: it must be
// reset. On any other error the log is untouched and agrees with whichever
// snapshot is in place.
func (l *durableLog) install(c *compaction) error {
	tail := l.tail
	if c.gen != l.gen || l.f == nil {
		l.abandon(c)
		return errSuperseded
	}
	if c.start+int64(len(tail)) != l.size { // append and rewind keep them in step: a bug
		l.abandon(c)
		return fmt.Errorf("push log is %d bytes, not the %d at the compaction's start plus %d since", l.size, c.start, len(tail))
	}
	l.tail = nil
	if err := c.file.Commit(); err != nil {
		return fmt.Errorf("install push snapshot: %w", err)
	}
	c.step(stepInstalled)
	var err error
	if len(tail) == 0 {
		err = l.empty()
	} else {
		err = l.replace(tail)
	}
	if err == nil {
		c.step(stepCut)
	}
	return err
}

// replace makes the log hold tail only, in a new file renamed over the old:
// the records appended since the compaction began, all durable. If the
// new file cannot be written, the old one stays (it holds them too). Once
// the rename is tried, which file the name holds after a crash is not
// known, nor may the old file take records: errRewind, and reset rewrites
// both from the state.
func (l *durableLog) replace(tail []byte) error {
	path := filepath.Join(l.dir, logFile)
	p, err := atomicfile.Prepare(path, tail, 0o640)
	if err != nil {
		return fmt.Errorf("write push log after its snapshot: %w", err)
	}
	if err := p.Commit(); err != nil {
		return fmt.Errorf("replace push log: %w: %w", errRewind, err)
	}
	f, err := l.open(path, 0)
	if err != nil {
		return fmt.Errorf("reopen push log: %w: %w", errRewind, err)
	}
	size := int64(len(tail))
	if _, err := f.Seek(size, io.SeekStart); err != nil {
		_ = f.Close()
		return fmt.Errorf("seek push log: %w: %w", errRewind, err)
	}
	_ = l.f.Close() // no longer in the directory: nothing reads it again
	l.f, l.size, l.synced = f, size, size
	return nil
}
