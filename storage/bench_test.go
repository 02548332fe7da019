package storage_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
)

func BenchmarkWrite(b *testing.B) {
	const series = 1000
	db, err := storage.OpenWithBucket(discard, nil, b.TempDir(), storage.Config{}, objstore.NewInMemBucket(), time.Now)
	require.NoError(b, err)
	defer func() { require.NoError(b, db.Close()) }()

	batch := make([]prompb.TimeSeries, series)
	for i := range batch {
		batch[i] = prompb.TimeSeries{
			Labels: []prompb.Label{
				{Name: "__name__", Value: "bench_metric"},
				{Name: "_id", Value: "cluster-1"},
				{Name: "instance", Value: fmt.Sprintf("host-%04d", i)},
			},
			Samples: []prompb.Sample{{}},
		}
	}
	ts := time.Now().Add(-time.Hour).UnixMilli()
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64((&prompb.WriteRequest{Timeseries: batch}).Size()))
	iters := 0
	for b.Loop() {
		ts++
		for i := range batch {
			batch[i].Samples[0] = prompb.Sample{Timestamp: ts, Value: float64(iters)}
		}
		st, err := db.Write(ctx, "bench", batch)
		if err != nil || st.Samples != series {
			b.Fatalf("write: %v, %+v", err, st)
		}
		iters++
	}
	b.ReportMetric(float64(series*iters)/b.Elapsed().Seconds(), "samples/s")
}
