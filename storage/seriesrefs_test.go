package storage

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestSeriesRefCache covers the reference cache's three states: a cached
// reference reused, an entry the head no longer knows, and the head
// truncated under it. Every sample must land on the right series in all.
func TestSeriesRefCache(t *testing.T) {
	db := openInternal(t)

	lsA := []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "a"}}
	lsB := []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "b"}}
	t0 := time.Now().Add(-time.Hour).UnixMilli()
	write := func(ts int64) {
		t.Helper()
		st, err := db.Write(context.Background(), "t", []prompb.TimeSeries{
			{Labels: lsA, Samples: []prompb.Sample{{Value: 1, Timestamp: ts}}},
			{Labels: lsB, Samples: []prompb.Sample{{Value: 2, Timestamp: ts}}},
		})
		require.NoError(t, err)
		require.Equal(t, 2, st.Samples)
	}
	write(t0)
	write(t0 + 1)
	tn := db.tenant("t")
	require.Equal(t, 2, tn.refs.len())
	keyA := tn.refs.key(lsA)
	refA := tn.refs.get(keyA)
	require.NotZero(t, refA)
	write(t0 + 2)
	require.Equal(t, refA, tn.refs.get(keyA), "an existing series keeps its reference")

	// An entry the head does not know (as after the head dropped the series).
	tn.refs.put(keyA, refA+1_000_000)
	write(t0 + 3)
	require.Equal(t, refA, tn.refs.get(keyA), "the stale entry is corrected")

	// The head is compacted and truncated: its series are dropped and the
	// entries with them.
	tn.refs.put(seriesKey{1, 2}, 99) // a series that left
	require.Equal(t, 3, tn.refs.len())
	require.NoError(t, flushHead(tn.db, db.blockMs()))
	write(t0 + 4)
	require.Equal(t, 2, tn.refs.len(), "the entry of the series that left is gone")

	require.Equal(t, map[string][]float64{"a": {1, 1, 1, 1, 1}, "b": {2, 2, 2, 2, 2}}, valuesByName(t, db, "t"))
}

// valuesByName reads every sample of tenant, grouped by the series' name
// label (storagetest.ValuesByLabel, which this package's own tests cannot
// import: it imports storage).
func valuesByName(t *testing.T, db *DB, tenant string) map[string][]float64 {
	t.Helper()
	q, err := db.Querier(tenant, math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	set := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	got := map[string][]float64{}
	for set.Next() {
		it := set.At().Iterator(nil)
		for it.Next() != 0 {
			_, v := it.At()
			name := set.At().Labels().Get("name")
			got[name] = append(got[name], v)
		}
		require.NoError(t, it.Err())
	}
	require.NoError(t, set.Err())
	return got
}

// len is the number of entries.
func (r *seriesRefs) len() int {
	n := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}
