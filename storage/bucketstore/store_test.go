package bucketstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore/providers/filesystem"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var discard = slog.New(slog.DiscardHandler)

// replica writes series into a receiver storage that ships to bucketDir with
// the given replica label, then closes it (flush + upload).
func replica(t *testing.T, bucketDir, name string, write func(db *storage.DB)) {
	t.Helper()
	cfg := storage.Config{ExternalLabels: map[string]string{"replica": name}}
	cfg.Bucket.Type = storage.BucketFilesystem
	cfg.Bucket.Filesystem.Directory = bucketDir
	db, err := storage.Open(discard, nil, t.TempDir(), cfg)
	require.NoError(t, err)
	write(db)
	require.NoError(t, db.Close())
}

// recentInOneBlock is a time about a minute ago such that the span before it
// does not straddle a 2h block boundary (each replica would cut two blocks
// instead of one).
func recentInOneBlock(span time.Duration) int64 {
	now := time.Now().Add(-time.Minute).UnixMilli()
	const blockMs = int64(2 * time.Hour / time.Millisecond)
	if boundary := now / blockMs * blockMs; now-boundary < span.Milliseconds() {
		now = boundary - int64(time.Minute/time.Millisecond)
	}
	return now
}

func series(cluster string, ts []int64, v func(int64) float64) prompb.TimeSeries {
	s := prompb.TimeSeries{Labels: []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: cluster}}}
	for _, t := range ts {
		s.Samples = append(s.Samples, prompb.Sample{Timestamp: t, Value: v(t)})
	}
	return s
}

type sample struct {
	T int64
	V float64
}

func readAll(t *testing.T, q promstorage.Querier) map[string][]sample {
	t.Helper()
	defer func() { require.NoError(t, q.Close()) }()
	ss := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	out := map[string][]sample{}
	var it chunkenc.Iterator
	for ss.Next() {
		it = ss.At().Iterator(it)
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			out[ss.At().Labels().String()] = append(out[ss.At().Labels().String()], sample{ts, v})
		}
		require.NoError(t, it.Err())
	}
	require.NoError(t, ss.Err())
	require.Empty(t, ss.Warnings())
	return out
}

func TestReaderMergesReplicasAndDeduplicates(t *testing.T) {
	bucketDir := t.TempDir()
	now := recentInOneBlock(11 * time.Minute)
	var ts []int64
	for i := range 40 {
		ts = append(ts, now-int64(40-i)*15_000)
	}
	val := func(t int64) float64 { return float64(t % 1000) }
	write := func(db *storage.DB, tenant string, s ...prompb.TimeSeries) {
		_, err := db.Write(context.Background(), tenant, s)
		require.NoError(t, err)
	}
	// a on r0, b on r1, shared on both (half of its samples each, overlapping in the middle).
	replica(t, bucketDir, "r0", func(db *storage.DB) {
		write(db, "acme", series("a", ts, val), series("shared", ts[:25], val))
		write(db, "other", series("x", ts, val))
	})
	replica(t, bucketDir, "r1", func(db *storage.DB) {
		write(db, "acme", series("b", ts, val), series("shared", ts[15:], val))
	})

	bkt, err := filesystem.NewBucket(bucketDir)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	store, err := bucketstore.New(discard, reg, bkt, filepath.Join(t.TempDir(), "cache"), bucketstore.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, store.Close()) }()
	require.NoError(t, store.Sync(context.Background()))
	require.Len(t, store.Blocks("acme", math.MinInt64, math.MaxInt64), 2)

	local, err := storage.Open(discard, nil, t.TempDir(), storage.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, local.Close()) }()
	r := bucketstore.NewReader(local, store)

	q, err := r.Querier("acme", math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	got := readAll(t, q)
	want := map[string][]sample{}
	for _, c := range []string{"a", "b", "shared"} {
		for _, x := range ts {
			k := fmt.Sprintf(`{__name__="up", _id=%q}`, c)
			want[k] = append(want[k], sample{x, val(x)})
		}
	}
	require.Equal(t, want, got)
	require.Equal(t, 2.0, testutil.ToFloat64(store.CacheBlocksGauge()))

	q, err = r.Querier("other", math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	require.Len(t, readAll(t, q), 1)
	q, err = r.Querier("nobody", math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	require.Empty(t, readAll(t, q))
}

func TestCacheEvictsWithinBudgetAndAdoptsOnRestart(t *testing.T) {
	bucketDir := t.TempDir()
	now := time.Now().Add(-time.Minute).UnixMilli()
	for i := range 3 {
		replica(t, bucketDir, fmt.Sprintf("r%d", i), func(db *storage.DB) {
			_, err := db.Write(context.Background(), fmt.Sprintf("t%d", i), []prompb.TimeSeries{series("c", []int64{now}, func(int64) float64 { return 1 })})
			require.NoError(t, err)
		})
	}
	bkt, err := filesystem.NewBucket(bucketDir)
	require.NoError(t, err)
	cache := filepath.Join(t.TempDir(), "cache")
	store, err := bucketstore.New(discard, nil, bkt, cache, bucketstore.Options{CacheMaxBytes: 1})
	require.NoError(t, err)
	require.NoError(t, store.Sync(context.Background()))
	for i := range 3 {
		qs := store.Queriers(fmt.Sprintf("t%d", i), math.MinInt64, math.MaxInt64, nil)
		require.Len(t, qs, 1)
		require.Equal(t, 0.0, testutil.ToFloat64(store.CacheBlocksGauge()), "downloaded on first use")
		_, _, err := qs[0].LabelNames(context.Background(), nil)
		require.NoError(t, err)
		// In use: kept although over budget.
		require.Equal(t, 1.0, testutil.ToFloat64(store.CacheBlocksGauge()))
		require.Len(t, readAll(t, qs[0]), 1)
		// Released: evicted.
		require.Equal(t, 0.0, testutil.ToFloat64(store.CacheBlocksGauge()))
	}
	require.NoError(t, store.Close())

	// A generous budget keeps blocks, and a new Store adopts them.
	store, err = bucketstore.New(discard, nil, bkt, cache, bucketstore.Options{})
	require.NoError(t, err)
	require.NoError(t, store.Sync(context.Background()))
	for _, q := range store.Queriers("t0", math.MinInt64, math.MaxInt64, nil) {
		readAll(t, q)
	}
	require.NoError(t, store.Close())
	store, err = bucketstore.New(discard, nil, bkt, cache, bucketstore.Options{})
	require.NoError(t, err)
	require.Equal(t, 1.0, testutil.ToFloat64(store.CacheBlocksGauge()))
	require.NoError(t, store.Close())
}

// TestReaderWarnsUntilTheBucketIsListed: after a restart the blocks only in
// the bucket are unknown until a sync succeeds. Until then every read
// carries a warning (so rules skip and remote read fails) rather than
// answering with local data alone as if it were everything.
func TestReaderWarnsUntilTheBucketIsListed(t *testing.T) {
	bucketDir := t.TempDir()
	now := recentInOneBlock(time.Minute)
	replica(t, bucketDir, "r0", func(db *storage.DB) {
		_, err := db.Write(context.Background(), "acme", []prompb.TimeSeries{series("a", []int64{now}, func(int64) float64 { return 1 })})
		require.NoError(t, err)
	})
	bkt, err := filesystem.NewBucket(bucketDir)
	require.NoError(t, err)
	store, err := bucketstore.New(discard, nil, bkt, filepath.Join(t.TempDir(), "cache"), bucketstore.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, store.Close()) }()
	local, err := storage.Open(discard, nil, t.TempDir(), storage.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, local.Close()) }()
	r := bucketstore.NewReader(local, store)

	require.False(t, store.Listed())
	q, err := r.Querier("acme", math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	ss := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	require.False(t, ss.Next(), "the block is not known yet")
	require.NoError(t, ss.Err())
	require.Len(t, ss.Warnings(), 1)
	require.ErrorContains(t, ss.Warnings().AsErrors()[0], "the bucket has not been listed")
	_, ws, err := q.LabelValues(context.Background(), "_id", nil)
	require.NoError(t, err)
	require.Len(t, ws, 1)
	require.NoError(t, q.Close())

	require.NoError(t, store.Sync(context.Background()))
	require.True(t, store.Listed())
	q, err = r.Querier("acme", math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	require.Len(t, readAll(t, q), 1, "listed: the block is read, without a warning")
}

// Blocks in use by running queries cannot be evicted; once they fill the
// budget, no other block is downloaded (its data is missing, with an
// error the merge turns into a warning) until they are released: one
// query over a long range cannot fill the disk.
func TestCacheFullOfBlocksInUseRefusesDownloads(t *testing.T) {
	bucketDir := t.TempDir()
	now := time.Now().Add(-time.Minute).UnixMilli()
	for i := range 2 {
		replica(t, bucketDir, fmt.Sprintf("r%d", i), func(db *storage.DB) {
			_, err := db.Write(context.Background(), fmt.Sprintf("t%d", i), []prompb.TimeSeries{series("c", []int64{now}, func(int64) float64 { return 1 })})
			require.NoError(t, err)
		})
	}
	bkt, err := filesystem.NewBucket(bucketDir)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	store, err := bucketstore.New(discard, reg, bkt, filepath.Join(t.TempDir(), "cache"), bucketstore.Options{CacheMaxBytes: 1})
	require.NoError(t, err)
	defer func() { require.NoError(t, store.Close()) }()
	require.NoError(t, store.Sync(context.Background()))
	ctx := context.Background()

	inUse := store.Queriers("t0", math.MinInt64, math.MaxInt64, nil)
	require.Len(t, inUse, 1)
	_, _, err = inUse[0].LabelNames(ctx, nil) // downloaded, and held
	require.NoError(t, err)

	other := store.Queriers("t1", math.MinInt64, math.MaxInt64, nil)
	require.Len(t, other, 1)
	_, _, err = other[0].LabelNames(ctx, nil)
	require.ErrorContains(t, err, "block cache (bucket_store.cache_max_bytes) is full")
	require.NoError(t, other[0].Close())
	require.Equal(t, 1.0, testutil.ToFloat64(store.CacheBlocksGauge()))

	require.NoError(t, inUse[0].Close())
	other = store.Queriers("t1", math.MinInt64, math.MaxInt64, nil)
	require.Len(t, readAll(t, other[0]), 1, "downloaded once the other block is released")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	refused := -1.0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "phonehome_bucketstore_downloads_total" && m.GetLabel()[0].GetValue() == "cache_full" {
				refused = m.GetCounter().GetValue()
			}
		}
	}
	require.Equal(t, 1.0, refused, "the refusal is counted")
}
