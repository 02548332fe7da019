package bucketstore_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"path"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/promql"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
)

// gatedBucket holds every Get of a block's index until release is closed
// or the caller's context ends, as a hanging bucket does.
type gatedBucket struct {
	objstore.BucketReader
	release chan struct{}

	mu               sync.Mutex
	gets, held, peak int // index Gets: in all, held now, most held at once
}

func (b *gatedBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if path.Base(name) != "index" {
		return b.BucketReader.Get(ctx, name)
	}
	b.mu.Lock()
	b.gets++
	b.held++
	b.peak = max(b.peak, b.held)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.held--
		b.mu.Unlock()
	}()
	select {
	case <-b.release:
		return b.BucketReader.Get(ctx, name)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (b *gatedBucket) counts() (gets, held, peak int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gets, b.held, b.peak
}

// hangingFixture is tenant acme with one series in each of blocks bucket
// blocks, read through a gated bucket, and an empty local storage.
type hangingFixture struct {
	bkt    *gatedBucket
	reg    *prometheus.Registry
	store  *bucketstore.Store
	reader *bucketstore.Reader
	ts     int64 // of the samples
}

func newHangingFixture(t *testing.T, blocks int) *hangingFixture {
	t.Helper()
	bucketDir := t.TempDir()
	ts := recentInOneBlock(time.Minute)
	for i := range blocks {
		replica(t, bucketDir, fmt.Sprintf("r%d", i), func(db *storage.DB) {
			_, err := db.Write(context.Background(), "acme", []prompb.TimeSeries{series(fmt.Sprintf("c%d", i), []int64{ts}, func(int64) float64 { return 1 })})
			require.NoError(t, err)
		})
	}
	fs, err := filesystem.NewBucket(bucketDir)
	require.NoError(t, err)
	f := &hangingFixture{bkt: &gatedBucket{BucketReader: fs, release: make(chan struct{})}, reg: prometheus.NewRegistry(), ts: ts}
	// Long enough that a query bounded only by it fails the tests' 5s bound.
	f.store, err = bucketstore.New(discard, f.reg, f.bkt, filepath.Join(t.TempDir(), "cache"), bucketstore.Options{DownloadTimeout: 30 * time.Second})
	require.NoError(t, err)
	require.NoError(t, f.store.Sync(context.Background()))
	require.Len(t, f.store.Blocks("acme", math.MinInt64, math.MaxInt64), blocks)
	local, err := storage.Open(discard, nil, t.TempDir(), storage.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		f.releaseBucket()
		require.NoError(t, f.store.Close())
		require.NoError(t, local.Close())
	})
	f.reader = bucketstore.NewReader(local, f.store)
	return f
}

func (f *hangingFixture) releaseBucket() {
	select {
	case <-f.bkt.release:
	default:
		close(f.bkt.release)
	}
}

type selectResult struct {
	series int
	ws     annotations.Annotations
	err    error
	took   time.Duration
}

// selectUp reads every up series of acme through the reader with ctx. It
// does not fail the test, so it may run in a goroutine.
func (f *hangingFixture) selectUp(ctx context.Context) selectResult {
	start := time.Now()
	q, err := f.reader.Querier("acme", math.MinInt64, math.MaxInt64)
	if err != nil {
		return selectResult{err: err}
	}
	ss := q.Select(ctx, true, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "up"))
	var r selectResult
	for ss.Next() {
		r.series++
	}
	r.ws, r.err = ss.Warnings(), ss.Err()
	if err := q.Close(); r.err == nil {
		r.err = err
	}
	r.took = time.Since(start)
	return r
}

func (f *hangingFixture) downloads(t *testing.T, result string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "phonehome_bucketstore_downloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// requireWarning requires that ws hold exactly one warning, a bucket
// block's, wrapping target.
func requireWarning(t *testing.T, ws annotations.Annotations, target error) {
	t.Helper()
	require.Len(t, ws, 1)
	for _, w := range ws {
		require.ErrorIs(t, w, target)
		require.Contains(t, w.Error(), "bucket block ")
	}
}

// TestQueryStopsWaitingForHangingBucket: with a bucket that does not
// answer, a query ends when its context does, whether the engine's timeout
// or a cancellation, long before the download timeout; the download no one
// waits for is cancelled; and a query started later gets the block once the
// bucket answers.
func TestQueryStopsWaitingForHangingBucket(t *testing.T) {
	f := newHangingFixture(t, 1)

	// The engine's query timeout.
	eng := promql.NewEngine(promql.EngineOpts{Logger: discard, MaxSamples: 1e6, Timeout: 200 * time.Millisecond, LookbackDelta: 5 * time.Minute})
	queryable := promstorage.QueryableFunc(func(mint, maxt int64) (promstorage.Querier, error) {
		return f.reader.Querier("acme", mint, maxt)
	})
	qry, err := eng.NewInstantQuery(context.Background(), queryable, nil, "up", time.UnixMilli(f.ts))
	require.NoError(t, err)
	start := time.Now()
	res := qry.Exec(context.Background())
	took := time.Since(start)
	qry.Close()
	require.ErrorAs(t, res.Err, new(promql.ErrQueryTimeout))
	require.Less(t, took, 5*time.Second)

	// A client that goes away while its query waits.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan selectResult, 1)
	go func() { done <- f.selectUp(ctx) }()
	require.Eventually(t, func() bool { _, held, _ := f.bkt.counts(); return held == 1 }, 5*time.Second, 10*time.Millisecond)
	start = time.Now()
	cancel()
	r := <-done
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, r.err)
	require.Zero(t, r.series)
	requireWarning(t, r.ws, context.Canceled)

	// No download was waited for any more: each was cancelled.
	require.Eventually(t, func() bool {
		gets, held, _ := f.bkt.counts()
		return held == 0 && f.downloads(t, "cancelled") == float64(gets)
	}, 5*time.Second, 10*time.Millisecond)

	// A query that waits while the bucket still hangs gets the block
	// once it answers.
	gets, _, _ := f.bkt.counts()
	go func() { done <- f.selectUp(context.Background()) }()
	require.Eventually(t, func() bool { n, _, _ := f.bkt.counts(); return n > gets }, 5*time.Second, 10*time.Millisecond)
	f.releaseBucket()
	r = <-done
	require.NoError(t, r.err)
	require.Empty(t, r.ws)
	require.Equal(t, 1, r.series)
	require.Equal(t, 1.0, f.downloads(t, "success"))
	require.Zero(t, f.downloads(t, "error"))
}

// TestDownloadOutlivesAWaiterThatLeaves: two queries want the same block;
// one gives up, the other still gets it, and the block is downloaded once.
func TestDownloadOutlivesAWaiterThatLeaves(t *testing.T) {
	f := newHangingFixture(t, 1)

	done := make(chan selectResult, 1)
	go func() { done <- f.selectUp(context.Background()) }()
	require.Eventually(t, func() bool { _, held, _ := f.bkt.counts(); return held == 1 }, 5*time.Second, 10*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	r := f.selectUp(ctx)
	require.NoError(t, r.err)
	requireWarning(t, r.ws, context.DeadlineExceeded)
	require.Less(t, r.took, 5*time.Second)

	f.releaseBucket()
	r = <-done
	require.NoError(t, r.err)
	require.Empty(t, r.ws)
	require.Equal(t, 1, r.series)
	gets, _, _ := f.bkt.counts()
	require.Equal(t, 1, gets, "one download for both queries")
	require.Equal(t, 1.0, f.downloads(t, "success"))
	require.Zero(t, f.downloads(t, "cancelled"))
}

// TestQueryDownloadsFourBlocksAtATime: a query's first call, even a label
// call, which a merge querier makes on one block after the other, downloads
// its blocks 4 at a time.
func TestQueryDownloadsFourBlocksAtATime(t *testing.T) {
	f := newHangingFixture(t, 6)
	q, err := f.reader.Querier("acme", math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()

	type namesResult struct {
		names []string
		ws    annotations.Annotations
		err   error
	}
	done := make(chan namesResult, 1)
	go func() {
		names, ws, err := q.LabelValues(context.Background(), "_id", nil)
		done <- namesResult{names, ws, err}
	}()
	require.Eventually(t, func() bool { _, held, _ := f.bkt.counts(); return held == 4 }, 5*time.Second, 10*time.Millisecond)
	f.releaseBucket()
	r := <-done
	require.NoError(t, r.err)
	require.Empty(t, r.ws)
	require.Equal(t, []string{"c0", "c1", "c2", "c3", "c4", "c5"}, r.names)
	gets, _, peak := f.bkt.counts()
	require.Equal(t, 6, gets)
	require.Equal(t, 4, peak)
}
