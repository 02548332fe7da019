package fleet

import (
	"context"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/receive"
	"github.com/phonehome/phonehome/storage"
)

// BenchmarkReplay measures reopening the receiver's storage after a crash,
// which replays the WAL: one tenant of 200 clusters × 500 series with 3
// points each, the in-process counterpart of the restart scenario's replay.
// For profiling:
//
//	go test -run '^$' -bench Replay -cpuprofile cpu.out ./bench/fleet/
func BenchmarkReplay(b *testing.B) {
	const (
		clusters = 200
		series   = 500
		rounds   = 3
	)
	f, err := New(templates(b), clusters, series, 1)
	require.NoError(b, err)
	dir := b.TempDir()
	off := false // no head flush at Close: the series stay in the WAL
	cfg := storage.Config{UploadOnShutdown: &off, FlushOnShutdown: &off}
	logger := slog.New(slog.DiscardHandler)
	db, err := storage.Open(logger, nil, dir, cfg)
	require.NoError(b, err)
	h := receive.NewHandler(logger, nil, db, unlimitedRates(nil), receive.Options{})
	writeRounds(b, h, f, rounds, time.Now().Add(-time.Hour).UnixMilli(), 30_000)
	require.NoError(b, db.Close())

	// Once, untimed: the replay brings back every series.
	db, err = storage.Open(logger, nil, dir, cfg)
	require.NoError(b, err)
	q, err := db.Querier("fleet", math.MinInt64, math.MaxInt64)
	require.NoError(b, err)
	set := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+"))
	n := 0
	for set.Next() {
		n++
	}
	require.NoError(b, set.Err())
	require.NoError(b, q.Close())
	require.NoError(b, db.Close())
	require.Equal(b, clusters*series, n)

	b.ReportAllocs()
	for b.Loop() {
		db, err := storage.Open(logger, nil, dir, cfg)
		require.NoError(b, err)
		b.StopTimer()
		require.NoError(b, db.Close())
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*clusters*series), "ns/series")
}
