package forward

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openTestQueue(t *testing.T, dir string, opts QueueOptions) *Queue {
	t.Helper()
	q, err := OpenQueue(dir, discardLogger(), nil, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// drain pops every record, acknowledging each.
func drain(t *testing.T, q *Queue) []string {
	t.Helper()
	var out []string
	for {
		p, pos, _, ok, err := q.Peek()
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, string(p))
		require.NoError(t, q.Ack(pos))
	}
}

func payloads(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "%s-%03d", prefix, i)
	}
	return out
}

func strs(bs [][]byte) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return out
}

func segFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+segmentSuffix))
	require.NoError(t, err)
	sort.Strings(m)
	return m
}

func TestQueueFIFOAndRestart(t *testing.T) {
	dir := t.TempDir()
	q, err := OpenQueue(dir, discardLogger(), nil, QueueOptions{MaxBytes: 1 << 20, SegmentBytes: 200})
	require.NoError(t, err)
	in := payloads("a", 30)
	require.NoError(t, q.Append(in[:10]...))
	require.NoError(t, q.Append(in[10:]...))
	require.Greater(t, len(segFiles(t, dir)), 2, "small segments rotate")

	// Acknowledge the first five, then "crash" (close without draining).
	for range 5 {
		_, pos, _, ok, err := q.Peek()
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, q.Ack(pos))
	}
	require.NoError(t, q.Close())

	q2 := openTestQueue(t, dir, QueueOptions{MaxBytes: 1 << 20, SegmentBytes: 200})
	n, _ := q2.Len()
	require.Equal(t, 25, n)
	require.Equal(t, strs(in[5:]), drain(t, q2))
	n, b := q2.Len()
	require.Equal(t, 0, n)
	require.Equal(t, int64(0), b, "consumed segments are deleted")
	require.Len(t, segFiles(t, dir), 1)
}

func TestQueueDropsOldestWhenFull(t *testing.T) {
	dir := t.TempDir()
	var dropped []string
	recSize := int64(recordHeaderSize + len("a-000"))
	q := openTestQueue(t, dir, QueueOptions{
		MaxBytes: 10 * recSize, SegmentBytes: 2 * recSize,
		OnDrop: func(p []byte, _ Position) { dropped = append(dropped, string(p)) },
	})
	in := payloads("a", 25)
	for _, p := range in {
		require.NoError(t, q.Append(p))
		_, b := q.Len()
		require.LessOrEqual(t, b, 10*recSize)
	}
	got := drain(t, q)
	require.Equal(t, strs(in[len(in)-len(got):]), got, "the newest survive, in order")
	require.Equal(t, strs(in[:len(in)-len(got)]), dropped, "the oldest are dropped, in order")
	require.GreaterOrEqual(t, len(got), 8)

	err := q.Append(make([]byte, 10*recSize))
	require.ErrorIs(t, err, ErrRecordTooLarge)
}

func TestQueueAckAfterDropIsNoop(t *testing.T) {
	recSize := int64(recordHeaderSize + len("a-000"))
	q := openTestQueue(t, t.TempDir(), QueueOptions{MaxBytes: 2 * recSize, SegmentBytes: recSize})
	in := payloads("a", 3)
	require.NoError(t, q.Append(in[0]))
	_, pos, _, ok, err := q.Peek()
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, q.Append(in[1], in[2])) // drops in[0], in flight
	require.False(t, q.Pending(pos))
	require.NoError(t, q.Ack(pos))
	require.Equal(t, strs(in[1:]), drain(t, q))
}

func TestQueueRecoversTruncatedTail(t *testing.T) {
	for _, cut := range []int{1, recordHeaderSize - 1, recordHeaderSize, recordHeaderSize + 3} {
		t.Run(fmt.Sprintf("cut=%d", cut), func(t *testing.T) {
			dir := t.TempDir()
			q, err := OpenQueue(dir, discardLogger(), nil, QueueOptions{})
			require.NoError(t, err)
			in := payloads("b", 5)
			require.NoError(t, q.Append(in...))
			require.NoError(t, q.Close())

			// Simulate a torn write: a partial sixth record at the end.
			segs := segFiles(t, dir)
			require.Len(t, segs, 1)
			partial := EncodeRecord(nil, time.Now(), []byte("b-005-torn"))[:cut]
			f, err := os.OpenFile(segs[0], os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.Write(partial)
			require.NoError(t, err)
			require.NoError(t, f.Close())

			reg := prometheus.NewRegistry()
			q2, err := OpenQueue(dir, discardLogger(), reg, QueueOptions{})
			require.NoError(t, err)
			defer q2.Close()
			require.Equal(t, 1.0, testutil.ToFloat64(q2.m.corruptions))
			// Appending after recovery continues from the last good record.
			require.NoError(t, q2.Append([]byte("b-new")))
			require.Equal(t, append(strs(in), "b-new"), drain(t, q2))
		})
	}
}

func TestQueueRecoversCorruptedRecord(t *testing.T) {
	dir := t.TempDir()
	q, err := OpenQueue(dir, discardLogger(), nil, QueueOptions{SegmentBytes: 1 << 20})
	require.NoError(t, err)
	in := payloads("c", 6)
	require.NoError(t, q.Append(in...))
	require.NoError(t, q.Close())

	// Flip one payload byte of the fourth record: it alone is skipped.
	segs := segFiles(t, dir)
	flipPayloadByte(t, segs[0], 3, recordHeaderSize+len(in[0]))

	q2 := openTestQueue(t, dir, QueueOptions{SegmentBytes: 1 << 20})
	require.Equal(t, append(strs(in[:3]), strs(in[4:])...), drain(t, q2))
}

func TestQueueCorruptCursorRedelivers(t *testing.T) {
	dir := t.TempDir()
	q, err := OpenQueue(dir, discardLogger(), nil, QueueOptions{})
	require.NoError(t, err)
	in := payloads("d", 3)
	require.NoError(t, q.Append(in...))
	_, pos, _, _, err := q.Peek()
	require.NoError(t, err)
	require.NoError(t, q.Ack(pos))
	require.NoError(t, q.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, cursorFile), []byte("garbage"), 0o640))

	q2 := openTestQueue(t, dir, QueueOptions{})
	require.Equal(t, strs(in), drain(t, q2), "at-least-once: nothing unacknowledged is lost")
}

// TestQueueSegmentShorterThanCursor: a segment that ends before the cursor
// (cut from outside) holds only acknowledged records: none is delivered or
// counted as lost, corrupt or not.
func TestQueueSegmentShorterThanCursor(t *testing.T) {
	dir := t.TempDir()
	q := openTestQueue(t, dir, QueueOptions{SegmentBytes: 1 << 20})
	in := payloads("f", 4)
	require.NoError(t, q.Append(in...))
	for range 3 {
		_, pos, _, _, err := q.Peek()
		require.NoError(t, err)
		require.NoError(t, q.Ack(pos))
	}
	require.NoError(t, q.Close())
	segs := segFiles(t, dir)
	recLen := recordHeaderSize + len(in[0])
	require.NoError(t, os.Truncate(segs[0], int64(2*recLen)))
	flipPayloadByte(t, segs[0], 0, recLen)

	q2 := openTestQueue(t, dir, QueueOptions{SegmentBytes: 1 << 20})
	require.Empty(t, drain(t, q2))
	require.Zero(t, droppedRecords(q2, ReasonCorrupt))
}

// TestQueueCursorNegativeOffsetRedelivers: a cursor whose checksum passes
// but whose offset is negative is invalid too, and the queue still opens.
func TestQueueCursorNegativeOffsetRedelivers(t *testing.T) {
	dir := t.TempDir()
	q := openTestQueue(t, dir, QueueOptions{})
	in := payloads("e", 3)
	require.NoError(t, q.Append(in...))
	seq := q.segs[0].seq
	require.NoError(t, q.Close())
	var b [20]byte
	binary.BigEndian.PutUint64(b[0:8], seq)
	binary.BigEndian.PutUint64(b[8:16], 1<<63)
	binary.BigEndian.PutUint32(b[16:20], crc32.Checksum(b[:16], crcTable))
	require.NoError(t, os.WriteFile(filepath.Join(dir, cursorFile), b[:], 0o640))

	q2 := openTestQueue(t, dir, QueueOptions{})
	require.Equal(t, strs(in), drain(t, q2))
	require.Equal(t, 1.0, testutil.ToFloat64(q2.m.corruptions))
}

func TestQueueGauges(t *testing.T) {
	now := time.Unix(1000, 0)
	reg := prometheus.NewRegistry()
	q, err := OpenQueue(t.TempDir(), discardLogger(), reg, QueueOptions{MaxBytes: 3 << 20, Now: func() time.Time { return now }})
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP phonehome_forward_queue_max_bytes The queue's bound (queue.max_bytes): past it, the oldest records are dropped.
# TYPE phonehome_forward_queue_max_bytes gauge
phonehome_forward_queue_max_bytes 3.145728e+06
`), "phonehome_forward_queue_max_bytes"), "the alert on a filling queue divides by it")
	require.NoError(t, q.Append([]byte("x"), []byte("y")))
	now = now.Add(90 * time.Second)
	require.Equal(t, 2.0, testutil.ToFloat64(q.m.records))
	require.Equal(t, float64(2*(recordHeaderSize+1)), testutil.ToFloat64(q.m.bytes))
	age, err := testutil.GatherAndCount(reg, "phonehome_forward_queue_oldest_age_seconds")
	require.NoError(t, err)
	require.Equal(t, 1, age)
	require.InDelta(t, 90, q.oldestAge(), 0.001)
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(EncodeRecord(nil, time.UnixMilli(1767268800150), []byte("payload")))
	f.Add(EncodeRecord(nil, time.UnixMilli(0), nil))
	f.Add(EncodeRecord(EncodeRecord(nil, time.UnixMilli(1), []byte("a")), time.UnixMilli(2), []byte("bb")))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		off := 0
		for off < len(b) {
			ts, p, n, err := DecodeRecord(b[off:])
			if err != nil {
				require.ErrorIs(t, err, ErrCorruptRecord)
				return
			}
			require.Equal(t, recordHeaderSize+len(p), n)
			require.LessOrEqual(t, off+n, len(b))
			// A valid record re-encodes to the same bytes.
			require.Equal(t, b[off:off+n], EncodeRecord(nil, ts, p))
			off += n
		}
	})
}

// FuzzOpenSegment opens a queue whose one segment holds arbitrary bytes:
// no panic, and what it delivers are records valid in the file, in order.
func FuzzOpenSegment(f *testing.F) {
	rec := func(p string) []byte { return EncodeRecord(nil, time.UnixMilli(1), []byte(p)) }
	f.Add(slices.Concat(rec("a"), rec("bb"), rec("ccc")))
	bad := slices.Concat(rec("a"), rec("bb"), rec("ccc"))
	bad[len(rec("a"))+recordHeaderSize] ^= 0xff
	f.Add(bad)
	f.Add([]byte{0, 0, 0, 1, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("%020d%s", 1, segmentSuffix)), b, 0o640))
		q, err := OpenQueue(dir, discardLogger(), nil, QueueOptions{SegmentBytes: 1 << 20})
		require.NoError(t, err)
		defer q.Close()
		next := 0 // where the record after the last delivered may start
		for _, got := range drain(t, q) {
			found := false
			for off := next; off < len(b) && !found; off++ {
				if _, p, n, err := DecodeRecord(b[off:]); err == nil && string(p) == got {
					next, found = off+n, true
				}
			}
			require.True(t, found, "delivered %q is no valid record after the one before", got)
		}
	})
}

// TestQueueDirectoryIsExclusive: two forwarders on one queue directory
// (a shared volume, a second replica) would append at the same offsets of
// the head segment and overwrite each other's records. The second is
// refused until the first closes the queue.
func TestQueueDirectoryIsExclusive(t *testing.T) {
	dir := t.TempDir()
	q1, err := OpenQueue(dir, discardLogger(), nil, QueueOptions{})
	require.NoError(t, err)
	_, err = OpenQueue(dir, discardLogger(), nil, QueueOptions{})
	require.ErrorIs(t, err, ErrQueueLocked)

	require.NoError(t, q1.Append([]byte("one")))
	require.NoError(t, q1.Close())
	q2 := openTestQueue(t, dir, QueueOptions{})
	require.Equal(t, []string{"one"}, drain(t, q2), "the lock is released by Close")
}

// A disk that fills before MaxBytes does: the queue drops its oldest
// segment and keeps the newest data, as a full queue does, rather than
// refusing every new record while it keeps the old ones.
func TestQueueFullDiskDropsOldest(t *testing.T) {
	dir := t.TempDir()
	var dropped []string
	recSize := int64(recordHeaderSize + len("a-000"))
	q := openTestQueue(t, dir, QueueOptions{
		MaxBytes: 100 * recSize, SegmentBytes: 2 * recSize,
		OnDrop: func(p []byte, _ Position) { dropped = append(dropped, string(p)) },
	})
	disk := 7 * recSize // room for 7 records
	q.writeTo = func(f *os.File, b []byte) (int, error) {
		if q.total+int64(len(b)) > disk {
			return 0, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
		}
		return f.Write(b)
	}
	in := payloads("a", 25)
	for _, p := range in {
		require.NoError(t, q.Append(p))
	}
	got := drain(t, q)
	require.NotEmpty(t, got)
	require.Equal(t, strs(in[len(in)-len(got):]), got, "the newest survive, in order")
	require.Equal(t, strs(in[:len(in)-len(got)]), dropped, "the oldest are dropped (and reported), in order")

	// With nothing left to drop, a full disk is an error.
	q.writeTo = func(f *os.File, _ []byte) (int, error) {
		return 0, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
	}
	require.ErrorIs(t, q.Append([]byte("a-999")), syscall.ENOSPC)
}
