package forward

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func droppedRecords(q *Queue, reason string) float64 {
	return testutil.ToFloat64(q.m.droppedRecords.WithLabelValues(reason))
}

// flipPayloadByte corrupts the i-th record (of equal-sized records of
// recLen bytes) of the segment at path, so its checksum fails.
func flipPayloadByte(t *testing.T, path string, i, recLen int) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[i*recLen+recordHeaderSize+1] ^= 0xff
	require.NoError(t, os.WriteFile(path, b, 0o640))
}

// TestQueueCountsRecordsCutAtOpen: a segment cut at a corrupt record loses
// it and the unacknowledged records after it; they are counted as dropped
// records, as their samples cannot be. A corrupt acknowledged record loses
// nothing.
func TestQueueCountsRecordsCutAtOpen(t *testing.T) {
	in := payloads("c", 6)
	recLen := recordHeaderSize + len(in[0])
	for _, tc := range []struct {
		name         string
		acked, flip  int
		wantLost     float64
		wantDelivers int
	}{
		{name: "nothing acknowledged", acked: 0, flip: 3, wantLost: 3, wantDelivers: 3},
		{name: "cut after the cursor", acked: 2, flip: 3, wantLost: 3, wantDelivers: 1},
		{name: "corrupt before the cursor: acknowledged, not read", acked: 4, flip: 3, wantLost: 0, wantDelivers: 2},
		{name: "last record", acked: 0, flip: 5, wantLost: 1, wantDelivers: 5},
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
			flipPayloadByte(t, segs[0], tc.flip, recLen)

			var log bytes.Buffer
			q2, err := OpenQueue(dir, slog.New(slog.NewTextHandler(&log, nil)), nil, QueueOptions{SegmentBytes: 1 << 20})
			require.NoError(t, err)
			defer q2.Close()
			require.Equal(t, tc.wantLost, droppedRecords(q2, ReasonCorrupt))
			got := drain(t, q2)
			require.Len(t, got, tc.wantDelivers)
			if tc.wantLost == 0 {
				require.Equal(t, strs(in[tc.acked:]), got, "every unacknowledged record")
				return
			}
			require.Contains(t, log.String(), "segment="+segs[0])
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
		f.deliver(context.Background(), p, pos)
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
		f.deliver(context.Background(), p, pos)
		require.Equal(t, 1.0, droppedRecords(q, ReasonInvalid))
		n, _ := q.Len()
		require.Equal(t, 1, n, "the newer record stays queued")
	})
}
