package lifecycle

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
)

// shipReplicas ships, from two replicas r0 and r1 into the filesystem
// bucket dir, samples every 10 minutes over span ending at end: c1 on r0, c2
// on r1, and "shared" on both with the middle third on both (identical
// samples, as replicas hold them).
func shipReplicas(t *testing.T, dir string, end time.Time, span time.Duration) {
	t.Helper()
	start := end.Add(-span)
	for _, rep := range []string{"r0", "r1"} {
		cfg := storage.Config{ExternalLabels: map[string]string{"replica": rep}}
		cfg.Bucket.Type = storage.BucketFilesystem
		cfg.Bucket.Filesystem.Directory = dir
		db, err := storage.Open(discard, nil, t.TempDir(), cfg)
		require.NoError(t, err)
		mine := map[string]string{"r0": "c1", "r1": "c2"}[rep]
		for ts := start; ts.Before(end); ts = ts.Add(10 * time.Minute) {
			frac := float64(ts.Sub(start)) / float64(span)
			clusters := []string{mine}
			if (rep == "r0" && frac < 2.0/3) || (rep == "r1" && frac >= 1.0/3) {
				clusters = append(clusters, "shared")
			}
			var ss []prompb.TimeSeries
			for _, c := range clusters {
				ss = append(ss, prompb.TimeSeries{
					Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: c}},
					Samples: []prompb.Sample{{Timestamp: ts.UnixMilli(), Value: float64(ts.Unix() % 977)}},
				})
			}
			_, err := db.Write(context.Background(), "acme", ss)
			require.NoError(t, err)
		}
		require.NoError(t, db.Close())
	}
}

// content is what readers see in the live blocks: each series' samples
// (a set) and how many copies of samples the blocks hold in total.
type content struct {
	samples map[string]map[int64]float64
	copies  int
	blocks  int
	bytes   int64
}

func liveContent(t *testing.T, dir string) content {
	t.Helper()
	bkt, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	blocks := scanOK(t, bkt)
	c := content{samples: map[string]map[int64]float64{}}
	for _, b := range blocks {
		if b.meta == nil || b.mark != nil {
			continue
		}
		c.blocks++
		for _, f := range b.meta.Thanos.Files {
			c.bytes += f.SizeBytes
		}
		blk, err := tsdb.OpenBlock(discard, filepath.Join(dir, b.id.String()), nil, nil)
		require.NoError(t, err)
		q, err := tsdb.NewBlockQuerier(blk, math.MinInt64, math.MaxInt64)
		require.NoError(t, err)
		ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "_id", ".+"))
		for ss.Next() {
			k := ss.At().Labels().String()
			if c.samples[k] == nil {
				c.samples[k] = map[int64]float64{}
			}
			it := ss.At().Iterator(nil)
			for it.Next() == chunkenc.ValFloat {
				ts, v := it.At()
				c.samples[k][ts] = v
				c.copies++
			}
		}
		require.NoError(t, ss.Err())
		require.NoError(t, q.Close())
		require.NoError(t, blk.Close())
	}
	return c
}

func (c content) unique() int {
	n := 0
	for _, s := range c.samples {
		n += len(s)
	}
	return n
}

func compactorConfig(ranges ...time.Duration) CompactorConfig {
	t := true
	c := CompactorConfig{Enabled: &t}
	for _, r := range ranges {
		c.Ranges = append(c.Ranges, model.Duration(r))
	}
	c.SetDefaults()
	c.Wait = model.Duration(time.Hour)
	return c
}

// TestCompactionMergesReplicasIntoFewerBlocks compacts two days of 2h
// blocks from two replicas that overlap: the same samples are readable
// before and after, each once after, in fewer blocks and fewer bytes; the
// sources are deleted after the deletion delay.
func TestCompactionMergesReplicasIntoFewerBlocks(t *testing.T) {
	dir := t.TempDir()
	end := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	shipReplicas(t, dir, end, 48*time.Hour)
	before := liveContent(t, dir)
	require.Equal(t, 48, before.blocks)
	require.Greater(t, before.copies, before.unique(), "the replicas overlap")

	bkt, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	cfg := storage.Config{}
	cfg.SetDefaults()
	clock := end.Add(3 * 24 * time.Hour)
	r := New(discard, nil, bkt, cfg, Options{Compactor: compactorConfig(2*time.Hour, 12*time.Hour, 48*time.Hour), WorkDir: t.TempDir(), Now: func() time.Time { return clock }})
	require.NoError(t, r.RunOnce(context.Background()))
	after := liveContent(t, dir)
	require.Equal(t, before.samples, after.samples)
	require.Equal(t, after.unique(), after.copies, "one copy of every sample")
	require.Equal(t, 1, after.blocks, "2 days aligned to one 48h window")
	require.Less(t, after.bytes, before.bytes)
	t.Logf("blocks %d -> %d, bytes %d -> %d, samples %d copies -> %d", before.blocks, after.blocks, before.bytes, after.bytes, before.copies, after.copies)

	// A second run has nothing to do; after the delay the sources go.
	blocks := scanOK(t, bkt)
	n := len(blocks)
	require.NoError(t, r.RunOnce(context.Background()))
	blocks = scanOK(t, bkt)
	require.Len(t, blocks, n)
	clock = clock.Add(48 * time.Hour)
	require.NoError(t, r.RunOnce(context.Background()))
	blocks = scanOK(t, bkt)
	require.Len(t, blocks, 1)
	require.Equal(t, storage.SourceCompactor, blocks[0].meta.Thanos.Source)
	require.Equal(t, map[string]string{"tenant_id": "acme"}, blocks[0].meta.Thanos.Labels)
	require.Len(t, blocks[0].meta.Compaction.Sources, 48)
	require.Equal(t, after.samples, liveContent(t, dir).samples)
}

// TestCompactionCrashAtEachStep stops a compaction at every bucket write
// it makes (each object of each new block, each mark): the samples are
// always readable (the sources or the result), and a rerun finishes the
// job — one copy of every sample.
func TestCompactionCrashAtEachStep(t *testing.T) {
	golden := t.TempDir()
	end := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	shipReplicas(t, golden, end, 12*time.Hour)
	want := liveContent(t, golden)
	cfg := storage.Config{}
	cfg.SetDefaults()
	comp := compactorConfig(2*time.Hour, 6*time.Hour, 12*time.Hour)
	clock := func() time.Time { return end.Add(24 * time.Hour) }
	ctx := context.Background()
	for n := 0; ; n++ {
		dir := filepath.Join(t.TempDir(), "bucket")
		require.NoError(t, os.CopyFS(dir, os.DirFS(golden)))
		fsb, err := filesystem.NewBucket(dir)
		require.NoError(t, err)
		err = New(discard, nil, &crashingBucket{Bucket: fsb, n: n}, cfg, Options{Compactor: comp, WorkDir: t.TempDir(), Now: clock}).RunOnce(ctx)
		finished := err == nil
		got := liveContent(t, dir)
		require.Equal(t, want.samples, got.samples, "crash after %d writes", n)

		require.NoError(t, New(discard, nil, fsb, cfg, Options{Compactor: comp, WorkDir: t.TempDir(), Now: clock}).RunOnce(ctx), "rerun after %d", n)
		got = liveContent(t, dir)
		require.Equal(t, want.samples, got.samples, "rerun after %d", n)
		require.Equal(t, got.unique(), got.copies, "rerun after %d writes: one copy", n)
		require.Equal(t, 1, got.blocks, "rerun after %d writes", n)
		if finished {
			t.Logf("crashed at each of %d writes", n)
			return
		}
	}
}
