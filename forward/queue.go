package forward

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// On-disk format
//
// The queue is a directory of segment files named <20-digit sequence>.seg, a
// cursor file and a lock file (flocked while a Queue has the directory open,
// so a second forwarder on it fails to start instead of overwriting
// records). A segment is a sequence of records:
//
//	| length uint32 BE | crc32c uint32 BE | unix_ms int64 BE | payload (length bytes) |
//
// where crc32c (Castagnoli) covers unix_ms and payload. Records are appended
// to the last ("head") segment, which is fsynced before Append returns; a new
// segment is started once the head reaches SegmentBytes. The cursor file holds
// the (sequence, offset) of the oldest unacknowledged record plus a crc32c of
// those 16 bytes. It is replaced atomically (write + rename) on every Ack but
// not fsynced: after a power loss the queue may redeliver a few acknowledged
// records, never lose unacknowledged ones.
//
// Open scans every segment from the cursor on and truncates it at its first
// invalid record (short header, implausible length, short payload or
// checksum mismatch): a torn write at crash time loses only the record being
// written, and a corrupt acknowledged record, which is not read, nothing. A
// record that fails only its checksum while a valid record follows it (a bit
// flipped in the middle of a segment) is skipped instead, so the records
// after it are kept: the valid checksum after it shows its length was right.
// The unacknowledged records cut or skipped, and any record that cannot be
// read back later, are counted in
// phonehome_forward_dropped_records_total{reason="corrupt"} (see
// queue_dropped.go).

const (
	recordHeaderSize = 16
	// maxRecordBytes bounds the length field accepted when decoding, so a
	// corrupted length cannot make us allocate gigabytes.
	maxRecordBytes = 64 << 20
	segmentSuffix  = ".seg"
	cursorFile     = "cursor"
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrCorruptRecord is returned by DecodeRecord for any invalid record.
	ErrCorruptRecord = errors.New("corrupt record")
	// ErrRecordTooLarge is returned by Append for a record that can never fit the queue.
	ErrRecordTooLarge = errors.New("record larger than the queue")
	// ErrQueueClosed is returned after Close.
	ErrQueueClosed = errors.New("queue closed")
)

// EncodeRecord appends the encoded record for payload, stamped t, to dst.
func EncodeRecord(dst []byte, t time.Time, payload []byte) []byte {
	var h [recordHeaderSize]byte
	binary.BigEndian.PutUint32(h[0:4], uint32(len(payload)))
	binary.BigEndian.PutUint64(h[8:16], uint64(t.UnixMilli()))
	crc := crc32.Update(crc32.Checksum(h[8:16], crcTable), crcTable, payload)
	binary.BigEndian.PutUint32(h[4:8], crc)
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// DecodeRecord decodes the record at the start of b. It returns the record's
// time, its payload (aliasing b) and the number of bytes it occupies. Any
// short or invalid input yields an error wrapping ErrCorruptRecord.
func DecodeRecord(b []byte) (t time.Time, payload []byte, n int, err error) {
	if len(b) < recordHeaderSize {
		return time.Time{}, nil, 0, fmt.Errorf("%w: short header (%d bytes)", ErrCorruptRecord, len(b))
	}
	l := binary.BigEndian.Uint32(b[0:4])
	if l > maxRecordBytes {
		return time.Time{}, nil, 0, fmt.Errorf("%w: length %d exceeds %d", ErrCorruptRecord, l, maxRecordBytes)
	}
	end := recordHeaderSize + int(l)
	if len(b) < end {
		return time.Time{}, nil, 0, fmt.Errorf("%w: short payload (%d of %d bytes)", ErrCorruptRecord, len(b)-recordHeaderSize, l)
	}
	want := binary.BigEndian.Uint32(b[4:8])
	if got := crc32.Update(crc32.Checksum(b[8:16], crcTable), crcTable, b[recordHeaderSize:end]); got != want {
		return time.Time{}, nil, 0, fmt.Errorf("%w: checksum %08x, want %08x", ErrCorruptRecord, got, want)
	}
	ms := int64(binary.BigEndian.Uint64(b[8:16]))
	return time.UnixMilli(ms), b[recordHeaderSize:end], end, nil
}

// QueueOptions tunes a Queue. Zero values take defaults.
type QueueOptions struct {
	// MaxBytes bounds the total size of the segment files (default 256 MiB).
	MaxBytes int64
	// SegmentBytes is the size at which a new segment starts
	// (default MaxBytes/16, between 64 KiB and 64 MiB).
	SegmentBytes int64
	// OnDrop is called, with the queue locked, for every record dropped to make
	// room (oldest first), with its position (Peek's). The payload must not be
	// retained. A record that cannot be read back is not reported: the queue
	// counts it as a corrupt record. Optional.
	OnDrop func(payload []byte, pos Position)
	// Now returns the current time (default time.Now).
	Now func() time.Time
}

type segment struct {
	seq  uint64
	f    *os.File
	size int64
}

type recordRef struct {
	seq  uint64
	off  int64
	size int64 // header + payload
	t    time.Time
}

// Position identifies a record returned by Peek.
type Position struct {
	seq uint64
	off int64
}

// Queue is a durable FIFO of byte records bounded in bytes, for one producer
// and one consumer. All methods are safe for concurrent use. When an Append
// would exceed MaxBytes the oldest records are dropped (and reported through
// OnDrop) until it fits.
type Queue struct {
	dir    string
	opts   QueueOptions
	logger *slog.Logger
	m      *queueMetrics

	mu      sync.Mutex
	segs    []*segment  // oldest first; the last is the head
	records []recordRef // unacknowledged, oldest first
	total   int64       // sum of segment sizes
	closed  bool
	notify  chan struct{} // signalled (non-blocking) on Append
	lock    *os.File      // holds the directory's flock until Close
	// writeTo writes a record to a segment: (*os.File).Write, or a full
	// disk in tests.
	writeTo func(*os.File, []byte) (int, error)
}

type queueMetrics struct {
	bytes          prometheus.Gauge
	records        prometheus.Gauge
	corruptions    prometheus.Counter
	droppedRecords *prometheus.CounterVec // by reason: corrupt, invalid
}

// OpenQueue opens or creates the queue in dir, recovering from a torn or
// corrupted tail. reg may be nil.
func OpenQueue(dir string, logger *slog.Logger, reg prometheus.Registerer, opts QueueOptions) (*Queue, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 256 << 20
	}
	// A quarter of MaxBytes at most: space is freed a whole segment at a
	// time, so with a segment as big as the queue a full queue would drop
	// its whole backlog to append one record.
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = min(max(opts.MaxBytes/16, 64<<10), opts.MaxBytes/4, 64<<20)
	} else if opts.SegmentBytes > opts.MaxBytes/4 {
		logger.Warn("queue.segment_bytes above a quarter of queue.max_bytes, using a quarter", "segment_bytes", opts.SegmentBytes, "max_bytes", opts.MaxBytes)
		opts.SegmentBytes = opts.MaxBytes / 4
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create queue dir: %w", err)
	}
	lock, err := lockDir(dir, logger)
	if err != nil {
		return nil, err
	}
	q := &Queue{dir: dir, opts: opts, logger: logger, notify: make(chan struct{}, 1), lock: lock, writeTo: (*os.File).Write}
	f := promauto.With(reg)
	q.m = &queueMetrics{
		bytes: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_queue_bytes", Help: "Bytes of the on-disk queue's segment files.",
		}),
		records: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_queue_records", Help: "Unacknowledged records (remote-write requests) in the on-disk queue.",
		}),
		corruptions: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_forward_queue_corruptions_total", Help: "Invalid segment tails or cursor files found when opening the queue, and records that could not be read back.",
		}),
		droppedRecords: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_dropped_records_total",
			Help: "Queued records lost whose samples could not be counted in phonehome_forward_dropped_samples_total, by reason: corrupt (unreadable on disk), invalid (not a request this forwarder can decode).",
		}, []string{"reason"}),
	}
	for _, r := range []string{ReasonCorrupt, ReasonInvalid} {
		q.m.droppedRecords.WithLabelValues(r)
	}
	f.NewGauge(prometheus.GaugeOpts{
		Name: "phonehome_forward_queue_max_bytes", Help: "The queue's bound (queue.max_bytes): past it, the oldest records are dropped.",
	}).Set(float64(opts.MaxBytes))
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "phonehome_forward_queue_oldest_age_seconds", Help: "Age of the oldest unacknowledged record, 0 when the queue is empty.",
	}, q.oldestAge)
	if err := q.recover(); err != nil {
		_ = q.closeFiles() // the recovery error is the one to report
		return nil, err
	}
	q.updateGauges()
	return q, nil
}

func (q *Queue) segPath(seq uint64) string {
	return filepath.Join(q.dir, fmt.Sprintf("%020d%s", seq, segmentSuffix))
}

func (q *Queue) recover() error {
	entries, err := os.ReadDir(q.dir)
	if err != nil {
		return fmt.Errorf("read queue dir: %w", err)
	}
	var seqs []uint64
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, segmentSuffix) {
			continue
		}
		seq, err := strconv.ParseUint(strings.TrimSuffix(name, segmentSuffix), 10, 64)
		if err != nil {
			continue
		}
		seqs = append(seqs, seq)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	cur, curOK := q.readCursor()

	for _, seq := range seqs {
		if curOK && seq < cur.seq { // fully acknowledged
			if err := os.Remove(q.segPath(seq)); err != nil {
				return fmt.Errorf("remove acknowledged segment: %w", err)
			}
			continue
		}
		if err := q.loadSegment(seq, cur, curOK); err != nil {
			return err
		}
	}
	if len(q.segs) == 0 {
		next := uint64(1)
		if curOK {
			next = cur.seq + 1
		}
		if len(seqs) > 0 {
			next = max(next, seqs[len(seqs)-1]+1)
		}
		if err := q.newHead(next); err != nil {
			return err
		}
	}
	return q.gc()
}

func (q *Queue) loadSegment(seq uint64, cur Position, curOK bool) error {
	path := q.segPath(seq)
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read segment %s: %w", path, err)
	}
	off := 0
	if curOK && seq == cur.seq {
		// The acknowledged records before the cursor are not read again:
		// one corrupt there must not cut the unacknowledged ones after it.
		// A segment that ends before the cursor holds only those.
		off = int(min(cur.off, int64(len(b))))
	}
	for off < len(b) {
		t, _, n, err := DecodeRecord(b[off:])
		if err != nil {
			if n, ok := skippableRecord(b[off:]); ok {
				q.dropUnreadable(recordRef{seq: seq, off: int64(off), size: int64(n)}, err)
				off += n
				continue
			}
			lost := countRecords(b[off:])
			q.logger.Warn("truncating corrupted queue segment", "segment", path, "offset", off, "dropped_bytes", len(b)-off, "dropped_records", lost, "err", err)
			q.m.corruptions.Inc()
			q.m.droppedRecords.WithLabelValues(ReasonCorrupt).Add(float64(lost))
			if err := os.Truncate(path, int64(off)); err != nil {
				return fmt.Errorf("truncate segment %s: %w", path, err)
			}
			break
		}
		q.records = append(q.records, recordRef{seq: seq, off: int64(off), size: int64(n), t: t})
		off += n
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open segment %s: %w", path, err)
	}
	if _, err := f.Seek(int64(off), io.SeekStart); err != nil {
		_ = f.Close()
		return fmt.Errorf("seek segment %s: %w", path, err)
	}
	q.segs = append(q.segs, &segment{seq: seq, f: f, size: int64(off)})
	q.total += int64(off)
	return nil
}

func (q *Queue) newHead(seq uint64) error {
	path := q.segPath(seq)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("create segment: %w", err)
	}
	q.segs = append(q.segs, &segment{seq: seq, f: f})
	return syncDir(q.dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open queue dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync queue dir: %w", err)
	}
	return nil
}

func (q *Queue) readCursor() (Position, bool) {
	b, err := os.ReadFile(filepath.Join(q.dir, cursorFile))
	if errors.Is(err, os.ErrNotExist) {
		return Position{}, false
	}
	// A checksum that passes by chance may come with an offset no segment
	// has: a negative one, from which loadSegment cannot start reading.
	if err != nil || len(b) != 20 || crc32.Checksum(b[:16], crcTable) != binary.BigEndian.Uint32(b[16:]) || int64(binary.BigEndian.Uint64(b[8:16])) < 0 {
		q.logger.Warn("ignoring invalid queue cursor, unacknowledged records may be delivered twice", "err", err)
		q.m.corruptions.Inc()
		return Position{}, false
	}
	return Position{seq: binary.BigEndian.Uint64(b[0:8]), off: int64(binary.BigEndian.Uint64(b[8:16]))}, true
}

// writeCursor persists the position of the oldest unacknowledged record.
func (q *Queue) writeCursor() error {
	var p Position
	if len(q.records) > 0 {
		p = Position{q.records[0].seq, q.records[0].off}
	} else {
		h := q.segs[len(q.segs)-1]
		p = Position{h.seq, h.size}
	}
	var b [20]byte
	binary.BigEndian.PutUint64(b[0:8], p.seq)
	binary.BigEndian.PutUint64(b[8:16], uint64(p.off))
	binary.BigEndian.PutUint32(b[16:20], crc32.Checksum(b[:16], crcTable))
	tmp := filepath.Join(q.dir, cursorFile+".tmp")
	if err := os.WriteFile(tmp, b[:], 0o640); err != nil {
		return fmt.Errorf("write queue cursor: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(q.dir, cursorFile)); err != nil {
		return fmt.Errorf("replace queue cursor: %w", err)
	}
	return nil
}

// Append durably appends the payloads as records, in order, dropping the
// oldest records if needed to stay within MaxBytes. It returns after the data
// is fsynced. A payload that alone exceeds MaxBytes (or the record size limit)
// fails with ErrRecordTooLarge and nothing is appended.
func (q *Queue) Append(payloads ...[]byte) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrQueueClosed
	}
	var need int64
	for _, p := range payloads {
		n := int64(recordHeaderSize + len(p))
		if n > q.opts.MaxBytes || len(p) > maxRecordBytes {
			return fmt.Errorf("record of %d bytes, queue max %d: %w", n, q.opts.MaxBytes, ErrRecordTooLarge)
		}
		need += n
	}
	if need > q.opts.MaxBytes {
		return fmt.Errorf("batch of %d bytes, queue max %d: %w", need, q.opts.MaxBytes, ErrRecordTooLarge)
	}
	dropped := false
	for q.total+need > q.opts.MaxBytes && len(q.records) > 0 {
		q.dropOldest()
		dropped = true
		if err := q.gc(); err != nil {
			return err
		}
	}
	if q.total+need > q.opts.MaxBytes { // only consumed bytes in the head remain
		if err := q.gc(); err != nil {
			return err
		}
	}
	if dropped {
		if err := q.writeCursor(); err != nil {
			return err
		}
	}
	n, err := q.write(payloads)
	for errors.Is(err, syscall.ENOSPC) && n < len(payloads) && len(q.segs) > 1 {
		// The disk is full before the queue is: make room as a full queue
		// does, by dropping the oldest segment's records, so that the
		// newest data is kept rather than refused.
		if err = q.dropOldestSegment(); err != nil {
			break
		}
		var more int
		more, err = q.write(payloads[n:])
		n += more
	}
	if n > 0 {
		q.updateGauges()
		select {
		case q.notify <- struct{}{}:
		default:
		}
	}
	if err != nil && n > 0 {
		return &PartialAppendError{Appended: n, Err: err}
	}
	return err
}

// PartialAppendError: Append failed after it queued the first Appended
// payloads, which will be delivered (not fsynced if the sync failed).
type PartialAppendError struct {
	Appended int
	Err      error
}

func (e *PartialAppendError) Error() string {
	return fmt.Sprintf("%v (after %d records were queued)", e.Err, e.Appended)
}

func (e *PartialAppendError) Unwrap() error { return e.Err }

// appended is how many of Append's payloads were queued when it returned err.
func appended(err error, payloads int) int {
	var pe *PartialAppendError
	switch {
	case err == nil:
		return payloads
	case errors.As(err, &pe):
		return pe.Appended
	default:
		return 0
	}
}

// write writes and fsyncs payloads as records; it returns how many it
// queued, also on error.
func (q *Queue) write(payloads [][]byte) (int, error) {
	now := q.opts.Now()
	var buf []byte
	dirty := map[*segment]bool{}
	for i, p := range payloads {
		h := q.segs[len(q.segs)-1]
		if h.size > 0 && h.size+int64(recordHeaderSize+len(p)) > q.opts.SegmentBytes {
			if err := q.newHead(h.seq + 1); err != nil {
				return i, errors.Join(err, q.sync(dirty))
			}
			h = q.segs[len(q.segs)-1]
		}
		buf = EncodeRecord(buf[:0], now, p)
		if _, err := q.writeTo(h.f, buf); err != nil {
			// Leave the file consistent with what we know: cut the torn write.
			_ = h.f.Truncate(h.size)
			_, _ = h.f.Seek(h.size, io.SeekStart)
			return i, errors.Join(fmt.Errorf("append record: %w", err), q.sync(dirty))
		}
		q.records = append(q.records, recordRef{seq: h.seq, off: h.size, size: int64(len(buf)), t: now})
		h.size += int64(len(buf))
		q.total += int64(len(buf))
		dirty[h] = true
	}
	return len(payloads), q.sync(dirty)
}

func (q *Queue) sync(dirty map[*segment]bool) error {
	for s := range dirty {
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("sync segment: %w", err)
		}
	}
	return nil
}

// dropOldestSegment drops the records of the oldest segment that is not
// the head (reporting them to OnDrop) and deletes it, for a disk that is
// full (ENOSPC) before MaxBytes is reached.
func (q *Queue) dropOldestSegment() error {
	oldest := q.segs[0].seq
	for len(q.records) > 0 && q.records[0].seq == oldest {
		q.dropOldest()
	}
	q.logger.Warn("disk full before the queue: dropping its oldest segment", "dir", q.dir, "queue_bytes", q.total)
	if err := q.gc(); err != nil {
		return err
	}
	return q.writeCursor()
}

// dropOldest removes the oldest record, reporting it to OnDrop, or
// counting it as corrupt if it cannot be read back.
func (q *Queue) dropOldest() {
	r := q.records[0]
	q.records = q.records[1:]
	if q.opts.OnDrop == nil {
		return
	}
	p, err := q.readLocked(r)
	if err != nil {
		q.dropUnreadable(r, err)
		return
	}
	q.opts.OnDrop(p, Position{seq: r.seq, off: r.off})
}

// gc deletes segments whose records are all acknowledged. A fully consumed
// head is replaced by a fresh, empty one.
func (q *Queue) gc() error {
	for len(q.segs) > 0 {
		s := q.segs[0]
		isHead := len(q.segs) == 1
		if len(q.records) > 0 && q.records[0].seq <= s.seq {
			break // s still holds unacknowledged records
		}
		if isHead && s.size == 0 {
			break
		}
		if isHead {
			if err := q.newHead(s.seq + 1); err != nil {
				return err
			}
		}
		_ = s.f.Close()
		if err := os.Remove(q.segPath(s.seq)); err != nil {
			return fmt.Errorf("remove segment: %w", err)
		}
		q.total -= s.size
		q.segs = q.segs[1:]
	}
	q.updateGauges()
	return nil
}

func (q *Queue) readLocked(r recordRef) ([]byte, error) {
	var s *segment
	for _, x := range q.segs {
		if x.seq == r.seq {
			s = x
			break
		}
	}
	if s == nil {
		return nil, fmt.Errorf("segment %d: %w", r.seq, os.ErrNotExist)
	}
	b := make([]byte, r.size)
	if _, err := s.f.ReadAt(b, r.off); err != nil {
		return nil, fmt.Errorf("read record: %w", err)
	}
	_, p, _, err := DecodeRecord(b)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Peek returns the oldest unacknowledged record, its position and time, or
// ok=false if the queue is empty. The payload is a fresh copy owned by the caller.
func (q *Queue) Peek() (payload []byte, pos Position, t time.Time, ok bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, Position{}, time.Time{}, false, ErrQueueClosed
	}
	for len(q.records) > 0 {
		r := q.records[0]
		p, err := q.readLocked(r)
		if err == nil {
			return p, Position{r.seq, r.off}, r.t, true, nil
		}
		// Skip the record rather than wedge the consumer on it forever.
		q.dropUnreadable(r, err)
		q.records = q.records[1:]
		if err := q.gc(); err != nil {
			return nil, Position{}, time.Time{}, false, err
		}
		if err := q.writeCursor(); err != nil {
			return nil, Position{}, time.Time{}, false, err
		}
	}
	return nil, Position{}, time.Time{}, false, nil
}

// Notify returns a channel that receives a value after Append adds records.
// It is meant for the single consumer to wait on when Peek finds nothing.
func (q *Queue) Notify() <-chan struct{} { return q.notify }

// Pending reports whether pos is still the oldest unacknowledged record (it
// may have been dropped to make room).
func (q *Queue) Pending(pos Position) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pendingLocked(pos)
}

func (q *Queue) pendingLocked(pos Position) bool {
	return len(q.records) > 0 && q.records[0].seq == pos.seq && q.records[0].off == pos.off
}

// Ack removes the record at pos if it is still the oldest; otherwise (it was
// dropped meanwhile) it does nothing.
func (q *Queue) Ack(pos Position) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.ackLocked(pos)
}

func (q *Queue) ackLocked(pos Position) error {
	if q.closed {
		return ErrQueueClosed
	}
	if !q.pendingLocked(pos) {
		return nil
	}
	q.records = q.records[1:]
	if err := q.gc(); err != nil {
		return err
	}
	return q.writeCursor()
}

// Newest returns the time the newest unacknowledged record was queued, or
// ok=false if the queue is empty.
func (q *Queue) Newest() (t time.Time, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.records) == 0 {
		return time.Time{}, false
	}
	return q.records[len(q.records)-1].t, true
}

// Len returns the number of unacknowledged records and the bytes of the segment files.
func (q *Queue) Len() (records int, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.records), q.total
}

func (q *Queue) oldestAge() float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.records) == 0 {
		return 0
	}
	// Not below 0: the wall clock may have moved back since it was queued.
	return max(0, q.opts.Now().Sub(q.records[0].t).Seconds())
}

func (q *Queue) updateGauges() {
	q.m.bytes.Set(float64(q.total))
	q.m.records.Set(float64(len(q.records)))
}

func (q *Queue) setOnDropIfUnset(fn func([]byte, Position)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.opts.OnDrop == nil {
		q.opts.OnDrop = fn
	}
}

// Close closes the segment files. Records stay on disk for the next OpenQueue.
func (q *Queue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	return q.closeFiles()
}

func (q *Queue) closeFiles() error {
	var errs []error
	for _, s := range q.segs {
		if err := s.f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close segment: %w", err))
		}
	}
	if q.lock != nil { // last: the segments are closed before another may open them
		if err := q.lock.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close queue lock: %w", err))
		}
	}
	return errors.Join(errs...)
}
