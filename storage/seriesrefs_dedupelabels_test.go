//go:build dedupelabels

package storage

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestSeriesRefsSymbolTable: new series' labels are interned in the cache's
// table, which a head truncation replaces without breaking the labels
// already built with the old one.
func TestSeriesRefsSymbolTable(t *testing.T) {
	r := newSeriesRefs()
	old := r.symbols.Load()
	b := r.labelsBuilder()
	b.Add(model.MetricNameLabel, "csv_succeeded")
	b.Add("version", "1.2.3")
	ls := b.Labels()
	require.Equal(t, 4, old.Len(), "two names and two values interned")

	b = r.labelsBuilder()
	b.Add(model.MetricNameLabel, "csv_succeeded")
	b.Add("version", "1.2.4")
	b.Labels()
	require.Equal(t, 5, old.Len(), "only the new value added")

	r.sync(math.MaxInt64) // an empty head
	r.sync(0)             // the head's min time has not moved
	require.Same(t, old, r.symbols.Load())
	r.sync(7200_000)
	cur := r.symbols.Load()
	require.NotSame(t, old, cur)
	require.Zero(t, cur.Len())
	require.Equal(t, "1.2.3", ls.Get("version"), "labels built before keep their table")

	r.sync(3600_000) // older samples appended: nothing was dropped
	require.Same(t, cur, r.symbols.Load())
	r.sync(5400_000) // truncated, though below the min time of the last reset
	require.NotSame(t, cur, r.symbols.Load())
}

// TestConcurrentSeriesCreation: writers creating series at once in one
// tenant grow its symbol table past several doublings. Run with -race (make
// test does): Prometheus' ScratchBuilder.Labels reads a table unlocked while
// another build may grow it, which seriesRefs.build serialises. Without it
// the race detector reported the race in about half of the runs.
func TestConcurrentSeriesCreation(t *testing.T) {
	db := openInternal(t)

	const writers, requests, perRequest = 4, 20, 100
	ts := time.Now().Add(-time.Hour).UnixMilli()
	errs := make(chan error, writers*requests)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range requests {
				series := make([]prompb.TimeSeries, perRequest)
				for j := range series {
					series[j] = prompb.TimeSeries{
						Labels: []prompb.Label{
							{Name: model.MetricNameLabel, Value: "csv_succeeded"},
							{Name: "name", Value: fmt.Sprintf("operator-%d-%d-%d", w, i, j)},
							{Name: "version", Value: fmt.Sprintf("%d.%d.%d", w, i, j)},
						},
						Samples: []prompb.Sample{{Value: 1, Timestamp: ts}},
					}
				}
				_, err := db.Write(context.Background(), "fleet", series)
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	tn := db.tenant("fleet")
	require.Greater(t, tn.refs.symbols.Load().Len(), 8192, "the table grew past several doublings")
	require.Equal(t, uint64(writers*requests*perRequest), tn.db.Head().NumSeries())
}
