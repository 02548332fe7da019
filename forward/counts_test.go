package forward

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// gatedSender holds each record until the test answers it.
type gatedSender struct {
	entered chan struct{}
	answer  chan error
}

func (s *gatedSender) Send(context.Context, *prompb.WriteRequest) error {
	return errors.New("records only")
}

func (s *gatedSender) SendRecord(context.Context, Record) (Written, error) {
	s.entered <- struct{}{}
	return Written{}, <-s.answer
}

// evictingQueue is a queue in which a second 40 KiB record evicts the first.
func evictingQueue(t *testing.T) (*Queue, []byte) {
	q := openTestQueue(t, t.TempDir(), QueueOptions{MaxBytes: 64 << 10})
	body := make([]byte, 40<<10)
	require.NoError(t, q.Append(encodePayloadV2(10, body)))
	return q, body
}

// TestRecordEvictedWhileSentIsCountedOnce: a full queue evicts the record
// being sent, and the send then succeeds: its samples were delivered, so
// they count as sent and not also as dropped.
func TestRecordEvictedWhileSentIsCountedOnce(t *testing.T) {
	q, body := evictingQueue(t)
	s := &gatedSender{entered: make(chan struct{}, 1), answer: make(chan error, 1)}
	f := New(discardLogger(), nil, nil, Policy{}, q, s, Options{})
	p, pos, queuedAt, ok, err := q.Peek()
	require.NoError(t, err)
	require.True(t, ok)
	done := make(chan struct{})
	go func() { f.deliver(context.Background(), p, pos, queuedAt); close(done) }()
	<-s.entered
	require.NoError(t, q.Append(encodePayloadV2(5, body)))
	require.False(t, q.Pending(pos), "the record in flight was evicted")
	s.answer <- nil
	<-done
	require.Equal(t, 10.0, testutil.ToFloat64(f.m.sent))
	require.Zero(t, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonQueueFull)))

	// A record evicted while it is not in flight is dropped at once.
	require.NoError(t, q.Append(encodePayloadV2(7, body)))
	require.Equal(t, 5.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonQueueFull)))
}

// TestRecordEvictedWhileRetriedIsDroppedOnce: evicted between two attempts,
// the record is given up and counted dropped once, when delivery ends.
func TestRecordEvictedWhileRetriedIsDroppedOnce(t *testing.T) {
	q, body := evictingQueue(t)
	s := &gatedSender{entered: make(chan struct{}, 1), answer: make(chan error, 1)}
	sleep := func(context.Context, time.Duration) error {
		return q.Append(encodePayloadV2(5, body)) // the outage goes on; the queue fills
	}
	f := New(discardLogger(), nil, nil, Policy{}, q, s, Options{sleep: sleep})
	p, pos, queuedAt, _, err := q.Peek()
	require.NoError(t, err)
	s.answer <- RetryableError{Err: errors.New("503")}
	f.deliver(context.Background(), p, pos, queuedAt)
	<-s.entered
	require.Equal(t, 10.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonQueueFull)))
	require.Zero(t, testutil.ToFloat64(f.m.sent))
}

// TestPartialAppendCountsWhatWasQueued: a cycle whose second record cannot
// be stored (the next segment cannot be created) still queues the first,
// which will be delivered: it counts as queued, only the rest as dropped.
func TestPartialAppendCountsWhatWasQueued(t *testing.T) {
	q := openTestQueue(t, t.TempDir(), QueueOptions{MaxBytes: 1 << 20, SegmentBytes: 64 << 10})
	f := New(discardLogger(), nil, nil, Policy{}, q, &gatedSender{}, Options{})
	require.NoError(t, os.Mkdir(q.segPath(q.segs[len(q.segs)-1].seq+1), 0o750)) // the next segment's path is taken
	body := make([]byte, 40<<10)
	err := f.enqueue([][]byte{encodePayloadV2(10, body), encodePayloadV2(5, body)}, []int{10, 5})
	require.Error(t, err)
	var pe *PartialAppendError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 1, pe.Appended)
	require.Equal(t, 10.0, testutil.ToFloat64(f.m.queued))
	require.Equal(t, 5.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonQueueError)))
	records, _ := q.Len()
	require.Equal(t, 1, records)
}

// TestRecordEvictedBeforeDeliveryIsNotSent: evicted between the send
// loop's Peek and delivery, the record was counted dropped then, and is
// not sent (nor counted again).
func TestRecordEvictedBeforeDeliveryIsNotSent(t *testing.T) {
	q, body := evictingQueue(t)
	s := &gatedSender{entered: make(chan struct{}, 1), answer: make(chan error, 1)}
	f := New(discardLogger(), nil, nil, Policy{}, q, s, Options{})
	p, pos, _, ok, err := q.Peek()
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, q.Append(encodePayloadV2(5, body))) // a cycle evicts it now
	f.deliver(context.Background(), p, pos, time.Time{})
	require.Empty(t, s.entered, "an evicted record was sent")
	require.Zero(t, testutil.ToFloat64(f.m.sent))
	require.Equal(t, 10.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonQueueFull)))
}

// answerSender answers every record with w and err.
type answerSender struct {
	w   Written
	err error
}

func (s answerSender) Send(context.Context, *prompb.WriteRequest) error { return s.err }

func (s answerSender) SendRecord(context.Context, Record) (Written, error) { return s.w, s.err }

// TestRejectedRequestCountsWhatWasWritten: a 400 whose written counts say
// part of the request was stored (our receiver writes the valid series of a
// request it answers 400, e.g. a backlog partly beyond the out-of-order
// window) counts those samples as sent and only the rest as dropped.
func TestRejectedRequestCountsWhatWasWritten(t *testing.T) {
	q := openTestQueue(t, t.TempDir(), QueueOptions{})
	require.NoError(t, q.Append(encodePayloadV2(10, []byte("body"))))
	s := answerSender{w: Written{Samples: 6, Known: true}, err: &HTTPError{Code: 400, Message: "too old"}}
	f := New(discardLogger(), nil, nil, Policy{}, q, s, Options{})
	p, pos, _, ok, err := q.Peek()
	require.NoError(t, err)
	require.True(t, ok)
	f.deliver(context.Background(), p, pos, time.Time{})
	require.Equal(t, 6.0, testutil.ToFloat64(f.m.sent))
	require.Equal(t, 4.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonHTTP4xx)))
	records, _ := q.Len()
	require.Zero(t, records, "a rejection is not retried")
}
