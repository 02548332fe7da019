package storage

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestWriteReducesReservedHistogramSchemas: schemas 9 to 52 are reserved
// for finer exponential buckets; Prometheus' remote-write receiver stores
// such a histogram at schema 8 (the finest TSDB keeps) instead of refusing
// it, for integer and float histograms alike.
func TestWriteReducesReservedHistogramSchemas(t *testing.T) {
	db := openInternal(t)
	now := time.Now().UnixMilli()
	ih := &histogram.Histogram{
		Schema: 10, Count: 4, Sum: 3, ZeroThreshold: 0.001, ZeroCount: 0,
		PositiveSpans: []histogram.Span{{Offset: 0, Length: 4}}, PositiveBuckets: []int64{1, 0, 0, 0},
	}
	fh := ih.ToFloat(nil)
	fh.Schema = 52
	series := []prompb.TimeSeries{
		{Labels: []prompb.Label{{Name: "__name__", Value: "int_h"}}, Histograms: []prompb.Histogram{prompb.FromIntHistogram(now, ih)}},
		{Labels: []prompb.Label{{Name: "__name__", Value: "float_h"}}, Histograms: []prompb.Histogram{prompb.FromFloatHistogram(now, fh)}},
	}
	st, err := db.Write(context.Background(), "t", series)
	require.NoError(t, err)
	require.Equal(t, 2, st.Histograms)

	q, err := db.Querier("t", math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	defer q.Close()
	set := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	n := 0
	for set.Next() {
		it := set.At().Iterator(nil)
		require.NotEqual(t, 0, int(it.Next()))
		_, got := it.AtFloatHistogram(nil)
		require.Equal(t, histogram.ExponentialSchemaMax, got.Schema)
		require.Equal(t, 4.0, got.Count)
		n++
	}
	require.NoError(t, set.Err())
	require.Equal(t, 2, n)
}
