package storage

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
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
