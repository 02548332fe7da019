package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
)

const gone = "erase-me-0f3c9a71d2"

// shipBlocks writes clusters gone, keep1 and keep2 of tenant acme in three
// 2h windows, and keep9 of tenant other, into a receiver that uploads them
// to the filesystem bucket in dir, and returns acme's kept samples.
func shipBlocks(t *testing.T, dir string) map[string]int {
	t.Helper()
	cfg := storage.Config{}
	cfg.Bucket.Type = storage.BucketFilesystem
	cfg.Bucket.Filesystem.Directory = dir
	db, err := storage.Open(discard, nil, t.TempDir(), cfg)
	require.NoError(t, err)
	base := time.Now().Truncate(2 * time.Hour).Add(-6*time.Hour + 10*time.Minute)
	want := map[string]int{}
	for w := range 3 {
		var ss []prompb.TimeSeries
		for _, c := range []string{gone, "keep1", "keep2"} {
			s := prompb.TimeSeries{Labels: []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: c}}}
			for i := range 5 {
				s.Samples = append(s.Samples, prompb.Sample{Timestamp: base.Add(time.Duration(w)*2*time.Hour + time.Duration(i)*time.Minute).UnixMilli(), Value: float64(i)})
			}
			if c != gone {
				want[c] += 5
			}
			ss = append(ss, s)
		}
		_, err := db.Write(context.Background(), "acme", ss)
		require.NoError(t, err)
	}
	_, err = db.Write(context.Background(), "other", []prompb.TimeSeries{{
		Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: "keep9"}},
		Samples: []prompb.Sample{{Timestamp: base.UnixMilli(), Value: 1}},
	}})
	require.NoError(t, err)
	require.NoError(t, db.Close())
	return want
}

// readable counts the samples per _id of tenant acme in the raw blocks a
// reader uses: meta.json present, no deletion mark, not downsampled.
func readable(t *testing.T, dir string) map[string]int {
	t.Helper()
	bkt, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	blocks := scanOK(t, bkt)
	out := map[string]int{}
	for _, b := range blocks {
		if b.meta == nil || b.mark != nil || b.tenant() != "acme" || b.meta.Thanos.Downsample.Resolution != 0 {
			continue
		}
		blk, err := tsdb.OpenBlock(discard, filepath.Join(dir, b.id.String()), nil, nil)
		require.NoError(t, err)
		q, err := tsdb.NewBlockQuerier(blk, math.MinInt64, math.MaxInt64)
		require.NoError(t, err)
		ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "_id", ".+"))
		for ss.Next() {
			it := ss.At().Iterator(nil)
			for it.Next() == chunkenc.ValFloat {
				out[ss.At().Labels().Get("_id")]++
			}
		}
		require.NoError(t, ss.Err())
		require.NoError(t, q.Close())
		require.NoError(t, blk.Close())
	}
	return out
}

func grepFiles(t *testing.T, root string, needle string) []string {
	t.Helper()
	var hits []string
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		if bytes.Contains(b, []byte(needle)) {
			hits = append(hits, p)
		}
		return nil
	}))
	return hits
}

var errCrash = errors.New("crash")

// crashingBucket fails every write (upload or delete) after the first n,
// as if the process died there.
type crashingBucket struct {
	objstore.Bucket
	n int
}

func (b *crashingBucket) step() error {
	if b.n == 0 {
		return errCrash
	}
	b.n--
	return nil
}

func (b *crashingBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	if err := b.step(); err != nil {
		return err
	}
	return b.Bucket.Upload(ctx, name, r, opts...)
}

func (b *crashingBucket) Delete(ctx context.Context, name string) error {
	if err := b.step(); err != nil {
		return err
	}
	return b.Bucket.Delete(ctx, name)
}

// TestEraseBucketCrashAtEachStep stops the bucket erasure at every write it
// makes (each object uploaded, marked or deleted), checks that every sample
// of the other clusters is still readable, then reruns it: the rerun
// finishes, every kept sample is readable exactly once, and no byte of the
// erased id is left in the bucket.
func TestEraseBucketCrashAtEachStep(t *testing.T) {
	golden := t.TempDir()
	want := shipBlocks(t, golden)
	require.NotEmpty(t, grepFiles(t, golden, gone))
	ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", gone)}
	cfg := storage.Config{}
	cfg.SetDefaults()
	ctx := context.Background()

	for n := 0; ; n++ {
		dir := filepath.Join(t.TempDir(), "bucket")
		require.NoError(t, os.CopyFS(dir, os.DirFS(golden)))
		fsb, err := filesystem.NewBucket(dir)
		require.NoError(t, err)
		work := filepath.Join(t.TempDir(), "work")

		crash := New(discard, nil, &crashingBucket{Bucket: fsb, n: n}, cfg, Options{})
		_, err = crash.EraseBucket(ctx, "acme", ms, []string{gone}, work, func(int, int) {})
		finished := err == nil
		if !finished {
			require.ErrorIs(t, err, errCrash)
		}
		got := readable(t, dir)
		for c, w := range want {
			require.GreaterOrEqual(t, got[c], w, "crash after %d writes: %s lost samples", n, c)
		}

		res, err := New(discard, nil, fsb, cfg, Options{}).EraseBucket(ctx, "acme", ms, []string{gone}, work, func(int, int) {})
		require.NoError(t, err, "rerun after %d writes", n)
		require.Equal(t, want, readable(t, dir), "after %d writes and a rerun", n)
		require.Empty(t, grepFiles(t, dir, gone), "after %d writes and a rerun", n)
		if finished {
			require.Zero(t, res.Rewritten, "a rerun after a complete erasure finds nothing")
			require.Positive(t, n)
			return
		}
	}
}

func TestEraseBucketLeavesOtherTenantsAndCleanBlocks(t *testing.T) {
	dir := t.TempDir()
	shipBlocks(t, dir)
	bkt, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	before := scanOK(t, bkt)
	cfg := storage.Config{}
	cfg.SetDefaults()
	reads := &readRecorder{Bucket: bkt}
	r := New(discard, nil, reads, cfg, Options{})
	var calls [][2]int
	ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", "nobody")}
	res, err := r.EraseBucket(context.Background(), "acme", ms, []string{"nobody"}, t.TempDir(), func(d, n int) { calls = append(calls, [2]int{d, n}) })
	require.NoError(t, err)
	require.Equal(t, BucketErasure{Blocks: 3}, res)
	require.Equal(t, [][2]int{{0, 3}, {1, 3}, {2, 3}, {3, 3}}, calls)
	indexes := 0
	for _, n := range reads.names {
		require.NotContains(t, n, "/chunks/", "a block without the cluster is read from its index alone")
		if path.Base(n) == IndexFile {
			indexes++
		}
	}
	require.Equal(t, 3, indexes, "%v", reads.names)
	after := scanOK(t, bkt)
	require.Equal(t, len(before), len(after))
	for _, b := range after {
		ok, err := bkt.Exists(context.Background(), path.Join(b.id.String(), DeletionMarkFile))
		require.NoError(t, err)
		require.False(t, ok)
	}
}

// readRecorder records the objects read whole (Get).
type readRecorder struct {
	objstore.Bucket
	mu    sync.Mutex
	names []string
}

func (b *readRecorder) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	b.mu.Lock()
	b.names = append(b.names, name)
	b.mu.Unlock()
	return b.Bucket.Get(ctx, name)
}
