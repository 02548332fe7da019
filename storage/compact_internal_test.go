package storage

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/gcburst"
)

// The barrier: the heads' max times are not read for compaction while a
// write is in flight (each holds lifecycle for reading from first append to commit).
func TestHeadMaxTimesWaitForWritesInFlight(t *testing.T) {
	db := openInternal(t)
	db.stopCompactions() // this test cuts the head itself

	start := time.Now().Add(-5 * time.Hour).UnixMilli()
	for _, ts := range []int64{start, start + (3*time.Hour + time.Minute).Milliseconds()} {
		_, err := db.Write(context.Background(), "t", []prompb.TimeSeries{{
			Labels:  []prompb.Label{{Name: "__name__", Value: "m"}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: ts}},
		}})
		require.NoError(t, err)
	}

	db.lifecycle.RLock() // a write in flight
	got := make(chan int64)
	go func() {
		maxts, ok := db.headMaxTimes([]*tenant{db.tenant("t")})
		require.True(t, ok)
		got <- maxts[0]
	}()
	select {
	case <-got:
		t.Fatal("the head range was read while a write was in flight")
	case <-time.After(200 * time.Millisecond):
	}
	db.lifecycle.RUnlock()
	select {
	case maxt := <-got:
		require.Equal(t, start+(3*time.Hour+time.Minute).Milliseconds(), maxt)
	case <-time.After(10 * time.Second):
		t.Fatal("the barrier did not open after the write finished")
	}
}

// A tenant whose cut fails is retried after 1s, the wait doubling with each
// failure in a row up to 1m (phonehome_storage_head_compactions_failed_total's
// help), and at once again after a success.
func TestCompactRetriesBackOff(t *testing.T) {
	r := retries{}
	now := time.Unix(0, 0)
	require.False(t, r.waiting("t", now))
	var waits []time.Duration
	for range 8 {
		w := r.failed("t", now)
		waits = append(waits, w)
		require.True(t, r.waiting("t", now.Add(w-time.Millisecond)))
		require.False(t, r.waiting("t", now.Add(w)))
		require.False(t, r.waiting("other", now), "other tenants are not held back")
		now = now.Add(w)
	}
	s := time.Second
	require.Equal(t, []time.Duration{s, 2 * s, 4 * s, 8 * s, 16 * s, 32 * s, time.Minute, time.Minute}, waits)
	r.succeeded("t")
	require.False(t, r.waiting("t", now))
	require.Equal(t, time.Second, r.failed("t", now), "a success resets the wait")
}

// Head cuts and the shutdown flush run as GC bursts: begun before the block
// is written, ended after it; the cut only if the heap is quiet.
func TestHeadCompactionsRunAsGCBursts(t *testing.T) {
	db := openInternal(t)
	db.stopCompactions() // this test runs the round itself
	var blocksAtBegin, blocksAtEnd []int
	blocks := func() int { return len(db.tenant("t").db.Blocks()) }
	var always, ifQuiet int
	record := func(n *int) func() func() {
		return func() func() {
			*n++
			blocksAtBegin = append(blocksAtBegin, blocks())
			return func() { blocksAtEnd = append(blocksAtEnd, blocks()) }
		}
	}
	beginGCBurst, beginGCBurstIfQuiet = record(&always), record(&ifQuiet)
	defer func() { beginGCBurst, beginGCBurstIfQuiet = gcburst.Begin, gcburst.BeginIfQuiet }()

	write := func(ts int64) {
		_, err := db.Write(context.Background(), "t", []prompb.TimeSeries{{
			Labels:  []prompb.Label{{Name: "__name__", Value: "m"}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: ts}},
		}})
		require.NoError(t, err)
	}
	start := time.Now().Add(-5 * time.Hour).UnixMilli()
	write(start)
	db.compactHeads()
	require.Empty(t, blocksAtBegin, "nothing to cut: no burst")

	write(start + (3*time.Hour + time.Minute).Milliseconds())
	db.compactHeads()
	require.Equal(t, []int{0}, blocksAtBegin)
	require.Equal(t, []int{1}, blocksAtEnd, "the cut wrote its block inside the burst")
	require.Equal(t, 1, ifQuiet, "writes go on during a cut: a burst only if the heap is quiet")

	require.NoError(t, db.Close()) // flushes the rest of the head
	require.Equal(t, []int{0, 1}, blocksAtBegin)
	require.Len(t, blocksAtEnd, 2)
	require.Greater(t, blocksAtEnd[1], 1, "the flush wrote its blocks inside the burst")
	require.Equal(t, 1, always, "writes are stopped during the flush: always a burst")
}
