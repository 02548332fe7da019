package lifecycle

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
)

// aggr is a chunk in Thanos' aggregate encoding, as its bytes: what the
// test writes and reads back.
type aggr struct{ b []byte }

func (c *aggr) Bytes() []byte                              { return c.b }
func (*aggr) Encoding() chunkenc.Encoding                  { return storage.EncThanosAggr }
func (*aggr) Appender() (chunkenc.Appender, error)         { return nil, errors.New("read only") }
func (*aggr) Iterator(chunkenc.Iterator) chunkenc.Iterator { return chunkenc.NewNopIterator() }
func (*aggr) NumSamples() int                              { return 0 }
func (*aggr) Compact()                                     {}
func (c *aggr) Reset(b []byte)                             { c.b = b }

// rawPool reads aggregate chunks as their bytes.
type rawPool struct{ chunkenc.Pool }

func (p rawPool) Get(e chunkenc.Encoding, b []byte) (chunkenc.Chunk, error) {
	if e == storage.EncThanosAggr {
		return &aggr{b: slices.Clone(b)}, nil
	}
	return p.Pool.Get(e, b)
}

// aggrChunk encodes an AggrChunk as Thanos' downsampler does: count, sum,
// min, max and counter, each an XOR chunk, as uvarint length, encoding and
// bytes; the counter also holds the window's first and last raw samples.
// Sample timestamps are 5m window ends (minus 1 ms, as Thanos writes them).
func aggrChunk(t *testing.T, ts []int64, v float64) chunks.Meta {
	t.Helper()
	var (
		cs   [5]*chunkenc.XORChunk
		apps [5]chunkenc.Appender
	)
	for i := range cs {
		cs[i] = chunkenc.NewXORChunk()
		var err error
		apps[i], err = cs[i].Appender()
		require.NoError(t, err)
	}
	apps[4].Append(0, ts[0]-4*60_000, v)
	for i, x := range ts {
		apps[0].Append(0, x, 5)
		apps[1].Append(0, x, 5*v+float64(i))
		apps[2].Append(0, x, v)
		apps[3].Append(0, x, v+float64(i))
		apps[4].Append(0, x, v+float64(5*i))
	}
	apps[4].Append(0, ts[len(ts)-1], v+float64(5*len(ts)))
	var b []byte
	for _, c := range cs {
		b = binary.AppendUvarint(b, uint64(len(c.Bytes())))
		b = append(b, byte(c.Encoding()))
		b = append(b, c.Bytes()...)
	}
	return chunks.Meta{MinTime: ts[0], MaxTime: ts[len(ts)-1], Chunk: &aggr{b: b}}
}

// writeDownsampled puts into the filesystem bucket in dir a block as
// Thanos' compactor uploads it at 5m resolution over [mint, maxt): the
// series up{_id=...} of each cluster with two aggregate chunks, and a
// meta.json with the resolution, index stats and an extension. It returns
// the block's meta and each series' chunks.
func writeDownsampled(t *testing.T, dir string, mint, maxt int64, sources []ulid.ULID, lbls map[string]string, clusters ...string) (storage.ThanosMeta, map[string][]chunks.Meta) {
	t.Helper()
	id := ulid.Make()
	bdir := filepath.Join(dir, id.String())
	cw, err := chunks.NewWriter(filepath.Join(bdir, "chunks"))
	require.NoError(t, err)
	iw, err := index.NewWriter(context.Background(), filepath.Join(bdir, "index"))
	require.NoError(t, err)
	syms := append([]string{"__name__", "_id", "up"}, clusters...)
	slices.Sort(syms)
	for _, s := range syms {
		require.NoError(t, iw.AddSymbol(s))
	}
	const w = 5 * 60_000
	at := func(from, n int) []int64 {
		var ts []int64
		for k := range n {
			ts = append(ts, mint+int64(from+k+1)*w-1)
		}
		return ts
	}
	want := map[string][]chunks.Meta{}
	meta := storage.ThanosMeta{}
	for i, c := range slices.Sorted(slices.Values(clusters)) {
		ls := labels.FromStrings("__name__", "up", "_id", c)
		chks := []chunks.Meta{aggrChunk(t, at(0, 10), float64(i)), aggrChunk(t, at(30, 12), float64(i))}
		require.NoError(t, cw.WriteChunks(chks...))
		require.NoError(t, iw.AddSeries(promstorage.SeriesRef(i), ls, chks...))
		for j := range chks {
			chks[j].Ref = 0 // where it was written; the comparison is of times and bytes
		}
		want[ls.String()] = chks
		meta.Stats.NumSeries++
		meta.Stats.NumChunks += 2
		meta.Stats.NumSamples += 22
	}
	require.NoError(t, cw.Close())
	require.NoError(t, iw.Close())
	meta.ULID, meta.MinTime, meta.MaxTime, meta.Version = id, mint, maxt, 1
	meta.Compaction.Level, meta.Compaction.Sources = 2, sources
	meta.Thanos = storage.ThanosSection{
		Version: 1, Labels: lbls, Source: "compactor",
		Downsample: storage.ThanosDownsample{Resolution: 300_000},
		IndexStats: json.RawMessage(`{"series_max_size":1024,"chunk_max_size":512}`),
		Extensions: json.RawMessage(`{"team":"fleet"}`),
	}
	b, err := json.Marshal(meta)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(bdir, MetaFile), b, 0o644))
	return meta, want
}

// readChunks returns each series of the block in dir with its chunks'
// times and bytes.
func readChunks(t *testing.T, dir string) map[string][]chunks.Meta {
	t.Helper()
	ir, err := index.NewFileReader(filepath.Join(dir, "index"), index.DecodePostingsRaw)
	require.NoError(t, err)
	defer ir.Close()
	cr, err := chunks.NewDirReader(filepath.Join(dir, "chunks"), rawPool{chunkenc.NewPool()})
	require.NoError(t, err)
	defer cr.Close()
	name, value := index.AllPostingsKey()
	p, err := ir.Postings(context.Background(), name, value)
	require.NoError(t, err)
	out := map[string][]chunks.Meta{}
	var (
		sb   = labels.NewScratchBuilder(0)
		chks []chunks.Meta
	)
	for p.Next() {
		require.NoError(t, ir.Series(p.At(), &sb, &chks))
		for _, c := range chks {
			chk, iter, err := cr.ChunkOrIterable(c)
			require.NoError(t, err)
			require.Nil(t, iter)
			out[sb.Labels().String()] = append(out[sb.Labels().String()], chunks.Meta{MinTime: c.MinTime, MaxTime: c.MaxTime, Chunk: chk})
		}
	}
	require.NoError(t, p.Err())
	return out
}

// TestEraseBucketRewritesDownsampledBlocks: a block Thanos' compactor
// downsampled, holding the erased cluster and two others, is rewritten like
// a raw block: the other series keep their aggregate chunks byte for byte,
// the replacement keeps the thanos section (resolution, labels, index stats,
// extensions) with source "erasure", and no byte of the id is left in the
// bucket. Our bucket store ignores the downsampled block before and after
// (it does not take it for the raw blocks' replacement), and reads the raw
// blocks' rewrites.
func TestEraseBucketRewritesDownsampledBlocks(t *testing.T) {
	dir := t.TempDir()
	want := shipBlocks(t, dir)
	bkt, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	var (
		raw        []ulid.ULID
		mint, maxt int64 = math.MaxInt64, math.MinInt64
		lbls       map[string]string
	)
	for _, b := range scanOK(t, bkt) {
		if b.tenant() == "acme" {
			raw = append(raw, b.id)
			mint, maxt, lbls = min(mint, b.meta.MinTime), max(maxt, b.meta.MaxTime), b.meta.Thanos.Labels
		}
	}
	require.Len(t, raw, 3)
	old, chks := writeDownsampled(t, dir, mint, maxt, raw, lbls, gone, "keep1", "keep2")
	require.Equal(t, chks, readChunks(t, filepath.Join(dir, old.ULID.String())), "the test reads what it wrote")
	delete(chks, labels.FromStrings("__name__", "up", "_id", gone).String())

	ctx := context.Background()
	store, err := bucketstore.New(discard, nil, bkt, filepath.Join(t.TempDir(), "cache"), bucketstore.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, store.Close()) }()
	served := func() map[string]int {
		require.NoError(t, store.Sync(ctx))
		out := map[string]int{}
		for _, m := range store.Blocks("acme", math.MinInt64, math.MaxInt64) {
			require.NotEqual(t, old.ULID, m.ULID, "the downsampled block is not read")
		}
		for _, q := range store.Queriers("acme", math.MinInt64, math.MaxInt64, nil) {
			ss := q.Select(ctx, false, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "up"))
			for ss.Next() {
				it := ss.At().Iterator(nil)
				for it.Next() == chunkenc.ValFloat {
					out[ss.At().Labels().Get("_id")]++
				}
				require.NoError(t, it.Err())
			}
			require.NoError(t, ss.Err())
			require.NoError(t, q.Close())
		}
		return out
	}
	before := served()
	require.Len(t, store.Blocks("acme", math.MinInt64, math.MaxInt64), 3)

	cfg := storage.Config{}
	cfg.SetDefaults()
	r := New(discard, nil, bkt, cfg, Options{})
	erase := func(id string) (BucketErasure, error) {
		ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", id)}
		return r.EraseBucket(ctx, "acme", ms, []string{id}, filepath.Join(t.TempDir(), "work"), func(int, int) {})
	}
	res, err := erase("nobody")
	require.NoError(t, err)
	require.Equal(t, BucketErasure{Blocks: 4}, res)
	require.Len(t, objects(t, bkt, old.ULID), 3, "a downsampled block without the cluster stays")

	res, err = erase(gone)
	require.NoError(t, err)
	require.Equal(t, BucketErasure{Blocks: 4, Rewritten: 4, Series: 4, Deleted: 4}, res)
	require.Empty(t, objects(t, bkt, old.ULID))
	require.Empty(t, grepFiles(t, dir, gone))

	var got *storage.ThanosMeta
	for _, b := range scanOK(t, bkt) {
		if b.meta.Thanos.Downsample.Resolution != 0 {
			require.Nil(t, got, "one downsampled block")
			got = b.meta
		}
	}
	require.NotNil(t, got)
	require.Equal(t, chks, readChunks(t, filepath.Join(dir, got.ULID.String())), "the other clusters' chunks, byte for byte")
	require.Equal(t, storage.SourceErasure, got.Thanos.Source)
	require.Equal(t, []tsdb.BlockDesc{{ULID: old.ULID, MinTime: mint, MaxTime: maxt}}, got.Compaction.Parents)
	require.Equal(t, uint64(44), got.Stats.NumSamples, "Thanos counts windows")
	require.Equal(t, uint64(2), got.Stats.NumSeries)
	require.JSONEq(t, string(old.Thanos.IndexStats), string(got.Thanos.IndexStats))
	require.JSONEq(t, string(old.Thanos.Extensions), string(got.Thanos.Extensions))
	wantThanos, gotThanos := old.Thanos, got.Thanos
	wantThanos.Source, wantThanos.Files, wantThanos.SegmentFiles = storage.SourceErasure, got.Thanos.Files, got.Thanos.SegmentFiles
	wantThanos.IndexStats, wantThanos.Extensions, gotThanos.IndexStats, gotThanos.Extensions = nil, nil, nil, nil
	require.Equal(t, wantThanos, gotThanos)
	require.Equal(t, old.Compaction.Level, got.Compaction.Level)
	require.Equal(t, old.Compaction.Sources, got.Compaction.Sources)
	require.Equal(t, []string{"000001"}, got.Thanos.SegmentFiles)

	for c := range want {
		require.Equal(t, want[c], before[c])
	}
	require.Equal(t, want, served(), "the raw blocks' rewrites are read, the downsampled one is not")
	require.Equal(t, want, readable(t, dir))
}

// A downsampled block whose chunk reaches past its max time would need it
// trimmed, which means re-encoding: the erasure fails on it and leaves it
// as it is, rather than dropping or mangling the other series' chunks.
func TestEraseBucketRefusesToReencodeAggregateChunks(t *testing.T) {
	dir := t.TempDir()
	bkt, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	const mint = 1_800_000_000_000 - 1_800_000_000_000%7_200_000
	old, _ := writeDownsampled(t, dir, mint, mint+30*60_000, nil, map[string]string{"tenant_id": "acme"}, gone, "keep1")
	cfg := storage.Config{}
	cfg.SetDefaults()
	ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", gone)}
	_, err = New(discard, nil, bkt, cfg, Options{}).EraseBucket(context.Background(), "acme", ms, []string{gone}, t.TempDir(), func(int, int) {})
	require.ErrorContains(t, err, "cannot be re-encoded")
	require.Len(t, objects(t, bkt, old.ULID), 3)
}
