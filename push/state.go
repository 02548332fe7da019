package push

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"unique"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/phonehome/phonehome/atomicfile"
)

// The durable state lives in dir as two files:
//
//   - snapshot.json: the whole aggregated state as of record Seq, replaced
//     atomically (write to a temporary file, fsync, rename, fsync the dir).
//   - push.log: every accepted push since, one framed record each
//     (4-byte little-endian payload length, 4-byte CRC-32C of the payload,
//     JSON payload). A record is fsynced before its push is acknowledged;
//     concurrent pushes share one fsync (group commit).
//
// Recovery loads the snapshot and replays the records with a larger Seq
// (a crash between renaming a snapshot and truncating the log leaves records
// the snapshot already holds; their Seq makes replay skip them). A torn or
// corrupt tail was never acknowledged and is truncated.
//
// What every change of the two files keeps true, whenever a crash comes:
//
//  1. A push is acknowledged only once its record is in the log and an
//     fsync that started after its write has succeeded; the state in memory
//     holds exactly the acknowledged records (Gateway.settleLocked).
//  2. The snapshot at Seq S plus the log's records above S are exactly the
//     acknowledged pushes (less the series expired or erased, once their
//     snapshot is in place): the log holds every acknowledged record above
//     S, in Seq order, and no refused one (durableLog.reset cuts them).
//  3. A snapshot holds the state after the records up to its Seq, none
//     pending, and replaces the old one whole (atomicfile).
//  4. The log loses records only once a snapshot that holds them is in
//     place, its rename fsynced (compaction), or once they were refused.
//  5. Seqs grow in the log; after a reset the snapshot's Seq covers every
//     record written, refused ones included, so none of them replays.
//
// A flush's compaction (durableLog.begin) copies the state under the
// Gateway's mutex, writes the snapshot without it while pushes append to
// the log, and installs it under the mutex: the snapshot is renamed into
// place only if the log was not reset meanwhile (a reset's snapshot is
// newer, and its emptied log no longer holds the records between the two),
// then the log drops the records the snapshot holds and keeps those
// appended since (durableLog.install).
const (
	logFile      = "push.log"
	snapshotFile = "snapshot.json"
	maxRecord    = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errRewind means a failed append (or the truncation after a snapshot)
// could not be completed or undone: the log's tail is unknown, so it takes
// no further record until it is rewritten (durableLog.reset).
var errRewind = errors.New("rewind push log")

// record is one accepted push: the family types and histogram layouts it
// establishes and the samples it adds (or, for "last" gauges, sets).
type record struct {
	Seq     uint64            `json:"seq"`
	Tenant  string            `json:"tenant"`
	Time    int64             `json:"time,omitempty"`    // accepted at, Unix ms (0 in logs of older versions)
	Types   map[string]string `json:"types,omitempty"`   // family name → counter|gauge|histogram
	Layouts map[string]string `json:"layouts,omitempty"` // histogram series key → bucket bounds
	Samples []delta           `json:"samples"`
	// Evict are the series dropped to make room for this push's new ones
	// when the tenant's series budget is full (Gateway.makeRoomLocked),
	// before its samples apply. Logged, so that a replay evicts them too and
	// a refused push evicts nothing.
	Evict []seriesRef `json:"evict,omitempty"`
}

// seriesRef names a series by its labels (JSON: a label map, decoded into
// the shared symbol table as delta's labels).
type seriesRef struct{ labels.Labels }

func (r seriesRef) MarshalJSON() ([]byte, error) { return r.Labels.MarshalJSON() }

func (r *seriesRef) UnmarshalJSON(b []byte) error {
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	r.Labels = labelsFromMap(m)
	return nil
}

// delta is one sample of a push.
type delta struct {
	Labels labels.Labels `json:"labels"`
	Value  float64       `json:"value"`
	Set    bool          `json:"set,omitempty"` // replace instead of add ("last" gauges)
}

// tenantState is one tenant's aggregated state.
type tenantState struct {
	Types   map[string]string   `json:"types"`
	Layouts map[string]string   `json:"layouts"`
	Series  map[string]*aggItem `json:"-"` // by labels key
	// LayoutTouched is when a push last carried each histogram of Layouts
	// (Unix ms), so a layout expires with its series.
	LayoutTouched map[string]int64 `json:"-"`
	// flushedSeq is the Seq up to which the series were last written into
	// the tenant's TSDB: a series whose seq is not above it has its value
	// there, and may be evicted without losing it. 0 until the first
	// successful flush after a start.
	flushedSeq uint64
	// evict is the order in which the series budget evicts, as of the
	// flush at flushedSeq; built when first needed (evictOrder).
	evict *evictOrder
	// fresh holds the series pushed once since the last flush (and some
	// that no longer are: see isFresh), which the next flush makes
	// evictable (Gateway.makeRoomLocked tells 429 from 400 by them).
	fresh []freshSeries
}

// aggItem is one aggregated series. Once in the state it does not change:
// a push that adds to it replaces it (tenantState.apply), so that a flush
// reads the series it copied under the Gateway's mutex without it
// (tenantCopy). Only reinternLocked changes items in place, when no copy
// is read. The eviction bookkeeping tells a series pushed since it looked
// by the item's identity or its seq (evictOrder.current, isFresh).
type aggItem struct {
	Labels  labels.Labels `json:"labels"`
	Value   float64       `json:"value"`
	Touched int64         `json:"touched,omitempty"` // last push that added to it, Unix ms
	// Pushes is how many records added to it. A snapshot of an older
	// version has none; its series load as pushed twice (more than once:
	// the budget does not evict them first).
	Pushes int64  `json:"pushes,omitempty"`
	seq    uint64 // the last record that added to it (the snapshot's Seq if from one)
	// layout is layoutKeyOf(Labels), zero if none: decoded once, not for
	// every series at every flush (evictCandidates); the series of one
	// histogram share its string.
	layout unique.Handle[string]
}

// newAggItem is a series of the state, with its labels interned (called
// with the Gateway's mutex held, or by openState).
func newAggItem(ls labels.Labels) *aggItem {
	it := &aggItem{Labels: intern(ls)}
	it.setLayout()
	return it
}

func (it *aggItem) setLayout() {
	if lk, ok := layoutKeyOf(it.Labels); ok {
		it.layout = unique.Make(lk)
	}
}

// MarshalJSON writes a non-finite value as Prometheus' JSON API does
// ("+Inf", "-Inf", "NaN"): encoding/json refuses them, and a snapshot that
// cannot be written would stop compaction and erasure for every tenant.
// Pushes cannot make one (appendLocked refuses an overflow); a state from
// before that check can hold one.
func (it aggItem) MarshalJSON() ([]byte, error) {
	ls, err := it.Labels.MarshalJSON()
	if err != nil {
		return nil, err
	}
	b := append(append([]byte(`{"labels":`), ls...), `,"value":`...)
	if math.IsInf(it.Value, 0) || math.IsNaN(it.Value) {
		b = strconv.AppendQuote(b, strconv.FormatFloat(it.Value, 'f', -1, 64))
	} else {
		b = strconv.AppendFloat(b, it.Value, 'g', -1, 64)
	}
	if it.Touched != 0 {
		b = strconv.AppendInt(append(b, `,"touched":`...), it.Touched, 10)
	}
	if it.Pushes != 0 {
		b = strconv.AppendInt(append(b, `,"pushes":`...), it.Pushes, 10)
	}
	return append(b, '}'), nil
}

func newTenantState() *tenantState {
	return &tenantState{Types: map[string]string{}, Layouts: map[string]string{}, Series: map[string]*aggItem{}, LayoutTouched: map[string]int64{}}
}

// apply evicts what rec evicts and adds its samples to the state. rec was
// validated against the state before. It returns how many series it evicted.
func (ts *tenantState) apply(rec *record) int {
	evicted, layouts := 0, false
	for _, e := range rec.Evict {
		k := seriesKey(e.Labels)
		if _, ok := ts.Series[k]; ok {
			delete(ts.Series, k)
			evicted++
		}
		if lk, ok := layoutKeyOf(e.Labels); ok {
			_, has := ts.Layouts[lk]
			layouts = layouts || has
		}
	}
	if layouts {
		ts.dropOrphanLayouts()
	}
	for k, v := range rec.Types {
		ts.Types[k] = v
	}
	for k, v := range rec.Layouts {
		ts.Layouts[k] = v
		ts.LayoutTouched[k] = rec.Time
	}
	for _, d := range rec.Samples {
		k := seriesKey(d.Labels)
		it, ok := ts.Series[k]
		switch {
		case !ok:
			it = newAggItem(d.Labels)
			ts.Series[k] = it
			ts.fresh = append(ts.fresh, freshSeries{k, it})
		case it.seq != rec.Seq: // else this record made it, and no flush copied it since
			cp := *it // a flush may read it without the mutex (aggItem)
			it = &cp
			ts.Series[k] = it
		}
		if d.Set {
			it.Value = d.Value
		} else {
			it.Value += d.Value
		}
		it.Touched = rec.Time
		if it.seq != rec.Seq { // once per record, however many samples it has for the series
			it.Pushes++
			it.seq = rec.Seq
		}
	}
	return evicted
}

// expire drops the series and histogram layouts no push has touched since
// cutoff (Unix ms) and returns how many series went. The family types stay
// (they are bounded by push.allowed_metrics).
func (ts *tenantState) expire(cutoff int64) int {
	n := 0
	for k, it := range ts.Series {
		if it.Touched < cutoff {
			delete(ts.Series, k)
			n++
		}
	}
	for k, t := range ts.LayoutTouched {
		if t < cutoff {
			delete(ts.LayoutTouched, k)
			delete(ts.Layouts, k)
		}
	}
	return n
}

func seriesKey(ls labels.Labels) string { return string(ls.Bytes(nil)) }

// snapshot is the on-disk form of the whole state.
type snapshot struct {
	Seq     uint64                   `json:"seq"`
	Tenants map[string]snapshotEntry `json:"tenants"`
}

type snapshotEntry struct {
	Types         map[string]string `json:"types"`
	Layouts       map[string]string `json:"layouts"`
	LayoutTouched map[string]int64  `json:"layout_touched,omitempty"`
	Series        []*aggItem        `json:"series"`
}

// durableLog is the append-only log plus snapshot. Not safe for concurrent
// use; the Gateway serialises access under its mutex, except sync (see
// there) and a compaction's write (compaction.write), which touches its
// copy of the state and a file of its own only.
type durableLog struct {
	dir    string
	f      logFileIO // nil after a failed reset
	size   int64     // bytes written
	synced int64     // bytes known durable: the size when the last successful fsync started
	// gen is bumped by every reset: a compaction begun before one is void.
	gen uint64
	// tail is what append wrote since a compaction began (nil when none
	// runs): the records that the log keeps when it is installed.
	tail []byte
	// open opens the log file with os.O_RDWR and flag (reset empties it,
	// install reopens the one it wrote). openLogFile; tests wrap the file.
	open func(path string, flag int) (logFileIO, error)
}

// logFileIO is what durableLog needs of its file: *os.File, or in tests a
// wrapper that fails Sync.
type logFileIO interface {
	Write(b []byte) (int, error)
	Seek(offset int64, whence int) (int64, error)
	Truncate(size int64) error
	Sync() error
	Close() error
}

func openLogFile(path string, flag int) (logFileIO, error) {
	return os.OpenFile(path, os.O_RDWR|flag, 0o640)
}

// openState loads the snapshot and replays the log in dir, creating dir if
// needed. It returns the state, the last sequence number and the open log.
// Series and records written by versions that did not track when a series
// was last pushed count as pushed at now (so they expire a full TTL later).
func openState(logger *slog.Logger, dir string, now int64) (map[string]*tenantState, uint64, *durableLog, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, 0, nil, fmt.Errorf("create push state dir: %w", err)
	}
	// A process killed while writing the snapshot or rewriting the log
	// leaves its temporary file: nothing else will remove it.
	if err := atomicfile.RemoveStale(logger, filepath.Join(dir, snapshotFile), filepath.Join(dir, logFile)); err != nil {
		return nil, 0, nil, err
	}
	state := map[string]*tenantState{}
	var seq uint64
	b, err := os.ReadFile(filepath.Join(dir, snapshotFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, 0, nil, fmt.Errorf("read push snapshot: %w", err)
	default:
		var s snapshot
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, 0, nil, fmt.Errorf("decode push snapshot %s: %w", filepath.Join(dir, snapshotFile), err)
		}
		seq = s.Seq
		for name, e := range s.Tenants {
			ts := newTenantState()
			for k, v := range e.Types {
				ts.Types[k] = v
			}
			for k, v := range e.Layouts {
				ts.Layouts[k] = v
				ts.LayoutTouched[k] = now
				if t, ok := e.LayoutTouched[k]; ok {
					ts.LayoutTouched[k] = t
				}
			}
			for _, it := range e.Series {
				if it == nil {
					return nil, 0, nil, fmt.Errorf("decode push snapshot %s: tenant %s: a series is null", filepath.Join(dir, snapshotFile), name)
				}
				if it.Touched == 0 {
					it.Touched = now
				}
				it.seq = s.Seq
				it.setLayout()
				if it.Pushes == 0 {
					it.Pushes = 2
				}
				k := seriesKey(it.Labels)
				ts.Series[k] = it
				if it.Pushes == 1 { // unflushed until the first flush after the start
					ts.fresh = append(ts.fresh, freshSeries{k, it})
				}
			}
			state[name] = ts
		}
	}

	path := filepath.Join(dir, logFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("open push log: %w", err)
	}
	good, replayed, skipped, err := replay(f, seq, func(rec *record) {
		ts := state[rec.Tenant]
		if ts == nil {
			ts = newTenantState()
			state[rec.Tenant] = ts
		}
		if rec.Time == 0 {
			rec.Time = now
		}
		ts.apply(rec)
		seq = rec.Seq
	})
	if err != nil {
		_ = f.Close()
		return nil, 0, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, 0, nil, fmt.Errorf("stat push log: %w", err)
	}
	if st.Size() > good {
		logger.Warn("truncating torn push log tail (never acknowledged)", "path", path, "offset", good, "size", st.Size())
		if err := f.Truncate(good); err != nil {
			_ = f.Close()
			return nil, 0, nil, fmt.Errorf("truncate push log: %w", err)
		}
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return nil, 0, nil, fmt.Errorf("sync push log: %w", err)
		}
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		_ = f.Close()
		return nil, 0, nil, fmt.Errorf("seek push log: %w", err)
	}
	logger.Info("push state recovered", "tenants", len(state), "seq", seq, "replayed", replayed, "skipped", skipped)
	return state, seq, &durableLog{dir: dir, f: f, size: good, synced: good, open: openLogFile}, nil
}

// replay calls fn for every intact record with Seq > after and returns the
// offset just past the last intact record.
func replay(f *os.File, after uint64, fn func(*record)) (good int64, replayed, skipped int, err error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, 0, 0, fmt.Errorf("seek push log: %w", err)
	}
	r := bufio.NewReader(f)
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return good, replayed, skipped, nil // clean end or torn header
		}
		n := binary.LittleEndian.Uint32(hdr[:4])
		if n == 0 || n > maxRecord {
			return good, replayed, skipped, nil
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return good, replayed, skipped, nil
		}
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(hdr[4:]) {
			return good, replayed, skipped, nil
		}
		var rec record
		if err := json.Unmarshal(payload, &rec); err != nil {
			return good, replayed, skipped, nil
		}
		good += int64(len(hdr)) + int64(n)
		if rec.Seq <= after {
			skipped++
			continue
		}
		fn(&rec)
		after = rec.Seq
		replayed++
	}
}

// append writes rec (not yet durable: see sync). On failure the log is cut
// back to where it was, so a failed (unacknowledged) push never replays.
func (l *durableLog) append(rec *record) error {
	payload, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode push record: %w", err)
	}
	if len(payload) > maxRecord { // replay would take it for a torn tail and cut it, and all after it
		return reject(reasonTooLarge, errTooLarge, "push of %d bytes once encoded, more than one push may hold (%d)", len(payload), maxRecord)
	}
	buf := make([]byte, 8, 8+len(payload))
	binary.LittleEndian.PutUint32(buf[:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[4:], crc32.Checksum(payload, castagnoli))
	buf = append(buf, payload...)
	if _, err := l.f.Write(buf); err != nil {
		return errors.Join(fmt.Errorf("write push log: %w", err), l.rewind())
	}
	l.size += int64(len(buf))
	if l.tail != nil {
		l.tail = append(l.tail, buf...)
	}
	return nil
}

// sync makes every appended record durable. It may run concurrently with
// append (a group commit covers whatever was written before it started).
// After a failure nothing written since the last successful sync may be
// trusted, nor a later sync of the same file: see reset.
func (l *durableLog) sync() error {
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("sync push log: %w", err)
	}
	return nil
}

func (l *durableLog) rewind() error {
	if err := l.f.Truncate(l.size); err != nil {
		return fmt.Errorf("%w: %w", errRewind, err)
	}
	if _, err := l.f.Seek(l.size, io.SeekStart); err != nil {
		return fmt.Errorf("%w: %w", errRewind, err)
	}
	return nil
}

// compact writes the whole state as a snapshot at seq, then empties the log,
// all at once (Erase; a flush compacts in steps: begin). No record may be
// pending: the snapshot holds the state only. An error wrapping errRewind
// means the snapshot was written but the log could not be emptied cleanly;
// the log must then be reset.
func (l *durableLog) compact(state map[string]*tenantState, seq uint64) error {
	if err := l.writeSnapshot(state, seq); err != nil {
		return err
	}
	return l.empty()
}

// empty truncates the log once a snapshot holds all its records: a crash
// before the truncation only leaves records that replay skips by Seq.
func (l *durableLog) empty() error {
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("truncate push log: %w: %w", errRewind, err)
	}
	l.size, l.synced = 0, 0
	if _, err := l.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("seek push log: %w: %w", errRewind, err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("sync push log: %w: %w", errRewind, err)
	}
	return nil
}

func (l *durableLog) writeSnapshot(state map[string]*tenantState, seq uint64) error {
	s := snapshot{Seq: seq, Tenants: make(map[string]snapshotEntry, len(state))}
	for name, ts := range state {
		s.Tenants[name] = ts.view().snapshotEntry() // encoded before the mutex is let go: no copy
	}
	b, err := s.encode()
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(l.dir, snapshotFile), b, 0o640)
}

// tenantCopy is a tenant's state as a flush copies it under the Gateway's
// mutex, to read it without: its maps cloned, the series' aggItems shared
// (a push replaces those it changes, see aggItem). Cloning a map costs
// ~1 ms per 100k series, copying each series several times more.
type tenantCopy struct {
	types, layouts map[string]string
	layoutTouched  map[string]int64
	series         map[string]*aggItem
}

// copyTenant is called with the Gateway's mutex held.
func copyTenant(ts *tenantState) tenantCopy {
	return tenantCopy{
		types: maps.Clone(ts.Types), layouts: maps.Clone(ts.Layouts), layoutTouched: maps.Clone(ts.LayoutTouched),
		series: maps.Clone(ts.Series),
	}
}

// view is the tenant's state as a tenantCopy whose maps are the state's:
// to be read with the Gateway's mutex held, and not kept past it.
func (ts *tenantState) view() tenantCopy {
	return tenantCopy{types: ts.Types, layouts: ts.Layouts, layoutTouched: ts.LayoutTouched, series: ts.Series}
}

func (c tenantCopy) snapshotEntry() snapshotEntry {
	e := snapshotEntry{Types: c.types, Layouts: c.layouts, LayoutTouched: c.layoutTouched, Series: make([]*aggItem, 0, len(c.series))}
	for _, it := range c.series {
		e.Series = append(e.Series, it)
	}
	return e
}

func (s *snapshot) encode() ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode push snapshot: %w", err)
	}
	return b, nil
}

// reset starts the log afresh after a failure that left its file in doubt:
// an fsync failed, or a write could not be undone. After a failed fsync,
// Linux may have dropped the file's dirty pages and marked them clean
// (PostgreSQL's "fsyncgate"): neither what was written since the last good
// fsync nor a retried fsync of the same file can be trusted. The records
// written since were all refused (Gateway.settleLocked), and state holds
// exactly the acknowledged pushes, so reset
//
//  1. cuts the file back to what was durable and fsyncs the cut, so that a
//     restart — even after a machine crash — cannot replay a refused record
//     should the steps below fail. Best effort: the file may be failing
//     too. The file is closed either way and never read again but by a
//     replay; the fsync persists its new size, not the dropped pages whose
//     loss made it untrustworthy;
//  2. writes state as a snapshot at seq, in a new file (atomicfile): every
//     record written so far, refused ones included, has Seq ≤ seq, so
//     replay skips whatever of them reached the disk (a failed cut no
//     longer matters then);
//  3. reopens the log emptied, in a new file description, and fsyncs it.
//
// No record may be pending. If reset fails, the log takes no record, the
// error says whether the cut failed too (then a machine crash before a
// retry succeeds may replay a refused record), and the Gateway calls it
// again later.
func (l *durableLog) reset(state map[string]*tenantState, seq uint64) error {
	l.gen, l.tail = l.gen+1, nil
	var cutErr error
	if l.f != nil {
		cutErr = l.cut()
		l.f = nil
	}
	if err := l.writeSnapshot(state, seq); err != nil {
		return errors.Join(err, cutErr)
	}
	path := filepath.Join(l.dir, logFile)
	f, err := l.open(path, os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return errors.Join(fmt.Errorf("reopen push log: %w", err), cutErr)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return errors.Join(fmt.Errorf("sync push log: %w", err), cutErr)
	}
	l.f, l.size, l.synced = f, 0, 0
	return nil
}

// cut is reset's step 1: truncate the file to the durable bytes, fsync the
// truncation and close the file, whatever fails.
func (l *durableLog) cut() error {
	err := l.f.Truncate(l.synced)
	if err == nil {
		err = l.f.Sync()
	}
	if err != nil {
		err = fmt.Errorf("cut push log back to its %d durable bytes: %w", l.synced, err)
	}
	return errors.Join(err, l.f.Close())
}

func (l *durableLog) close() error {
	if l.f == nil {
		return nil
	}
	return l.f.Close()
}
