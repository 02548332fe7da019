package storage_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
)

// Heads are cut into blocks by the DB while writes run (isolation is off,
// compact.go): a leader drives the head's max time across eight block
// ranges while laggers write many series up to 59 minutes behind it (the
// edge of what the head still takes in order; later ones go out of order).
// Every acknowledged sample must be readable afterwards, from the head or a
// block, exactly once.
func TestHeadCompactionKeepsEveryAcknowledgedSample(t *testing.T) {
	reg := prometheus.NewRegistry()
	db := openTest(t, t.TempDir(), testConfig(), objstore.NewInMemBucket(), reg)
	const (
		laggers         = 3
		seriesPerLagger = 200
	)
	start := time.Now().Add(-20 * time.Hour).Truncate(2 * time.Hour).UnixMilli()
	end := start + (16 * time.Hour).Milliseconds()
	var front atomic.Int64
	front.Store(start)

	var mu sync.Mutex
	acked := map[string]int{} // series → acknowledged samples
	write := func(series []prompb.TimeSeries) {
		st, err := db.Write(context.Background(), "t", series)
		require.NoError(t, err)
		require.Equal(t, len(series), st.Samples)
		mu.Lock()
		for _, s := range series {
			acked[s.Labels[1].Value]++
		}
		mu.Unlock()
	}

	var wg sync.WaitGroup
	done := make(chan struct{})
	for l := range laggers {
		wg.Go(func() {
			last := int64(0)
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				ts := max(last+1, front.Load()-(59*time.Minute).Milliseconds()+int64(i%60)*1000)
				last = ts
				series := make([]prompb.TimeSeries, seriesPerLagger)
				for j := range series {
					series[j] = prompb.TimeSeries{
						Labels:  []prompb.Label{{Name: "__name__", Value: "lag"}, {Name: "s", Value: fmt.Sprintf("l%d-%d", l, j)}},
						Samples: []prompb.Sample{{Value: 1, Timestamp: ts}},
					}
				}
				write(series)
			}
		})
	}
	for ts := start; ts <= end; ts += (5 * time.Minute).Milliseconds() {
		front.Store(ts)
		write([]prompb.TimeSeries{{
			Labels:  []prompb.Label{{Name: "__name__", Value: "lead"}, {Name: "s", Value: "leader"}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: ts}},
		}})
		time.Sleep(2 * time.Millisecond)
	}
	close(done)
	wg.Wait()

	// The DB cut blocks while the writes ran, without TSDB's compaction.
	require.Eventually(t, func() bool {
		return counter(t, reg, "prometheus_tsdb_compactions_total", "") >= 6
	}, 30*time.Second, 100*time.Millisecond, "head blocks cut")
	require.NoError(t, db.Flush())

	q, err := db.Querier("t", 0, end+1)
	require.NoError(t, err)
	defer q.Close()
	got := map[string]int{}
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "s", ".+"))
	for ss.Next() {
		s := ss.At()
		it := s.Iterator(nil)
		for it.Next() != 0 {
			got[s.Labels().Get("s")]++
		}
		require.NoError(t, it.Err())
	}
	require.NoError(t, ss.Err())
	require.Len(t, got, laggers*seriesPerLagger+1)
	require.Equal(t, acked, got, "acknowledged samples per series")
	require.Zero(t, counter(t, reg, "phonehome_storage_head_compactions_failed_total", ""))
	// TSDB's own triggers are skipped (README, "Storage and object storage").
	require.Positive(t, counter(t, reg, "prometheus_tsdb_compactions_skipped_total", ""))
}
