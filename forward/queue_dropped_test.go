package forward

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func droppedRecords(q *Queue, reason string) float64 {
	return testutil.ToFloat64(q.m.droppedRecords.WithLabelValues(reason))
}

// flip is a corruption of byte at of record i: the bits of mask flipped.
type flip struct {
	i, at int
	mask  byte
}

// flipBytes corrupts records of the segment at path, whose records are all
// recLen bytes long.
func flipBytes(t *testing.T, path string, recLen int, flips ...flip) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, f := range flips {
		b[f.i*recLen+f.at] ^= f.mask
	}
	require.NoError(t, os.WriteFile(path, b, 0o640))
}

// flipPayloadByte corrupts the i-th record's payload, so its checksum fails.
func flipPayloadByte(t *testing.T, path string, i, recLen int) {
	t.Helper()
	flipBytes(t, path, recLen, flip{i, recordHeaderSize + 1, 0xff})
}

// TestQueueCountsRecordsLostAtOpen: a record whose checksum fails while a
// valid record follows it is skipped, and it alone is lost; one whose length
// broke (or that is last, or followed by another bad one) cuts the segment,
// losing the unacknowledged records after it too. Either way the records
// lost are counted, as their samples cannot be. A corrupt acknowledged record
// loses nothing.
func TestQueueCountsRecordsLostAtOpen(t *testing.T) {
	in := payloads("c", 6)
	recLen := recordHeaderSize + len(in[0])
	payload := func(i int) flip { return flip{i, recordHeaderSize + 1, 0xff} }
	for _, tc := range []struct {
		name     string
		acked    int
		flips    []flip
		wantLost []int // indexes into in
		counted  int   // of wantLost, if not all: after a broken length the count is a guess
	}{
		{name: "payload: skipped", flips: []flip{payload(3)}, wantLost: []int{3}},
		{name: "checksum field: skipped", flips: []flip{{3, 5, 0x10}}, wantLost: []int{3}},
		{name: "time: skipped", flips: []flip{{3, 12, 0x01}}, wantLost: []int{3}},
		{name: "payload after the cursor: skipped", acked: 2, flips: []flip{payload(3)}, wantLost: []int{3}},
		{name: "two apart: both skipped", flips: []flip{payload(1), payload(3)}, wantLost: []int{1, 3}},
		{name: "length inside the segment: cut", flips: []flip{{3, 3, 0x01}}, wantLost: []int{3, 4, 5}, counted: 2},
		{name: "length past the segment: cut", flips: []flip{{3, 3, 0xff}}, wantLost: []int{3, 4, 5}, counted: 1},
		{name: "two in a row: cut", flips: []flip{payload(2), payload(3)}, wantLost: []int{2, 3, 4, 5}},
		{name: "last record: cut", flips: []flip{payload(5)}, wantLost: []int{5}},
		{name: "before the cursor: acknowledged, not read", acked: 4, flips: []flip{payload(3)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			q, err := OpenQueue(dir, discardLogger(), nil, QueueOptions{SegmentBytes: 1 << 20})
			require.NoError(t, err)
			require.NoError(t, q.Append(in...))
			for range tc.acked {
				_, pos, _, _, err := q.Peek()
				require.NoError(t, err)
				require.NoError(t, q.Ack(pos))
			}
			require.NoError(t, q.Close())
			segs := segFiles(t, dir)
			require.Len(t, segs, 1)
			flipBytes(t, segs[0], recLen, tc.flips...)

			var log bytes.Buffer
			q2, err := OpenQueue(dir, slog.New(slog.NewTextHandler(&log, nil)), nil, QueueOptions{SegmentBytes: 1 << 20})
			require.NoError(t, err)
			defer q2.Close()
			counted := len(tc.wantLost)
			if tc.counted > 0 {
				counted = tc.counted
			}
			require.Equal(t, float64(counted), droppedRecords(q2, ReasonCorrupt))
			var want []string
			for i := tc.acked; i < len(in); i++ {
				if !slices.Contains(tc.wantLost, i) {
					want = append(want, string(in[i]))
				}
			}
			require.NoError(t, q2.Append([]byte("c-new")))
			require.Equal(t, append(want, "c-new"), drain(t, q2), "the records kept, then one appended after the open")
			if len(tc.wantLost) > 0 {
				require.Contains(t, log.String(), "segment="+segs[0])
			}
		})
	}
}

func TestQueueCountsTornTailAsOneRecord(t *testing.T) {
	dir := t.TempDir()
	q, err := OpenQueue(dir, discardLogger(), nil, QueueOptions{})
	require.NoError(t, err)
	require.NoError(t, q.Append(payloads("b", 3)...))
	require.NoError(t, q.Close())
	segs := segFiles(t, dir)
	f, err := os.OpenFile(segs[0], os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write(EncodeRecord(nil, time.Now(), []byte("b-003-torn"))[:recordHeaderSize+3])
	require.NoError(t, err)
	require.NoError(t, f.Close())

	q2 := openTestQueue(t, dir, QueueOptions{})
	require.Equal(t, 1.0, droppedRecords(q2, ReasonCorrupt))
	require.Len(t, drain(t, q2), 3)
}

// TestQueueCountsRecordsUnreadableLater: a record that can no longer be read
// back, when it is next (Peek) or when a full queue evicts it, is counted
// and logged with its file.
func TestQueueCountsRecordsUnreadableLater(t *testing.T) {
	in := payloads("a", 4)
	recLen := recordHeaderSize + len(in[0])

	t.Run("peek", func(t *testing.T) {
		dir := t.TempDir()
		var log bytes.Buffer
		q, err := OpenQueue(dir, slog.New(slog.NewTextHandler(&log, nil)), nil, QueueOptions{SegmentBytes: 1 << 20})
		require.NoError(t, err)
		defer q.Close()
		require.NoError(t, q.Append(in...))
		segs := segFiles(t, dir)
		flipPayloadByte(t, segs[0], 1, recLen)
		require.Equal(t, []string{"a-000", "a-002", "a-003"}, drain(t, q))
		require.Equal(t, 1.0, droppedRecords(q, ReasonCorrupt))
		require.Contains(t, log.String(), "segment="+segs[0])
	})
	t.Run("evicted", func(t *testing.T) {
		dir := t.TempDir()
		var dropped []string
		q := openTestQueue(t, dir, QueueOptions{
			MaxBytes: int64(4 * recLen), SegmentBytes: int64(recLen),
			OnDrop: func(p []byte, _ Position) { dropped = append(dropped, string(p)) },
		})
		require.NoError(t, q.Append(in...))
		segs := segFiles(t, dir)
		flipPayloadByte(t, segs[0], 0, recLen)
		require.NoError(t, q.Append(payloads("b", 2)...))
		require.Equal(t, []string{"a-001"}, dropped, "the readable evicted record is reported")
		require.Equal(t, 1.0, droppedRecords(q, ReasonCorrupt), "the unreadable one is counted")
	})
}

// TestUndecodableRecordIsCountedOnce: a queued record this forwarder cannot
// decode is dropped and counted as a record, once, whether delivery or a
// full queue drops it first.
func TestUndecodableRecordIsCountedOnce(t *testing.T) {
	bad := []byte{0x00, 0x07, 'x'} // an unknown payload format

	t.Run("delivered", func(t *testing.T) {
		q := openTestQueue(t, t.TempDir(), QueueOptions{})
		f := New(discardLogger(), nil, nil, Policy{}, q, &gatedSender{}, Options{})
		require.NoError(t, q.Append(bad))
		p, pos, _, ok, err := q.Peek()
		require.NoError(t, err)
		require.True(t, ok)
		f.deliver(context.Background(), p, pos, time.Time{})
		require.Equal(t, 1.0, droppedRecords(q, ReasonInvalid))
		require.Zero(t, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonInvalid)), "no sample count is made up")
		n, _ := q.Len()
		require.Zero(t, n, "acknowledged")
	})
	t.Run("evicted after peek", func(t *testing.T) {
		q := openTestQueue(t, t.TempDir(), QueueOptions{MaxBytes: 64 << 10})
		f := New(discardLogger(), nil, nil, Policy{}, q, &gatedSender{}, Options{})
		require.NoError(t, q.Append(append(bad, make([]byte, 40<<10)...)))
		p, pos, _, ok, err := q.Peek()
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, q.Append(encodePayloadV2(5, make([]byte, 40<<10)))) // evicts it
		require.Equal(t, 1.0, droppedRecords(q, ReasonInvalid))
		f.deliver(context.Background(), p, pos, time.Time{})
		require.Equal(t, 1.0, droppedRecords(q, ReasonInvalid))
		n, _ := q.Len()
		require.Equal(t, 1, n, "the newer record stays queued")
	})
}
