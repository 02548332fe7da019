package lifecycle

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
)

// downsample turns block id of the filesystem bucket in dir into what
// Thanos' compactor uploads at 5m resolution, as far as a rewrite can tell:
// thanos.downsample.resolution set, and every chunk in Thanos' aggregate
// encoding (0xff), which Prometheus' chunk pool rejects.
func downsample(t *testing.T, dir string, id ulid.ULID) {
	t.Helper()
	metaPath := filepath.Join(dir, id.String(), MetaFile)
	b, err := os.ReadFile(metaPath)
	require.NoError(t, err)
	var m storage.ThanosMeta
	require.NoError(t, json.Unmarshal(b, &m))
	m.Thanos.Downsample.Resolution = 300_000
	b, err = json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(metaPath, b, 0o644))

	segs, err := filepath.Glob(filepath.Join(dir, id.String(), "chunks", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, segs)
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	for _, seg := range segs {
		b, err := os.ReadFile(seg)
		require.NoError(t, err)
		// Segment header (8 bytes), then per chunk: uvarint data length,
		// encoding, data, CRC32 of encoding and data.
		for off := 8; off < len(b); {
			n, w := binary.Uvarint(b[off:])
			require.Positive(t, w)
			enc := off + w
			end := enc + 1 + int(n)
			b[enc] = 0xff
			binary.BigEndian.PutUint32(b[end:], crc32.Checksum(b[enc:end], castagnoli))
			off = end + 4
		}
		require.NoError(t, os.WriteFile(seg, b, 0o644))
	}
}

// TestEraseBucketDeletesDownsampledBlocksHoldingTheCluster checks that an
// erasure does not abort on a downsampled block: one without the erased
// cluster is left alone, one holding it is deleted whole (it cannot be
// rewritten), and the raw blocks are rewritten as before.
func TestEraseBucketDeletesDownsampledBlocksHoldingTheCluster(t *testing.T) {
	dir := t.TempDir()
	want := shipBlocks(t, dir)
	bkt, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	var first *block // acme's oldest block
	blocks := scanOK(t, bkt)
	for i, b := range blocks {
		if b.tenant() == "acme" && (first == nil || b.meta.MinTime < first.meta.MinTime) {
			first = &blocks[i]
		}
	}
	require.NotNil(t, first)
	downsample(t, dir, first.id)
	cfg := storage.Config{}
	cfg.SetDefaults()
	r := New(discard, nil, bkt, cfg, Options{})
	ctx := context.Background()
	erase := func(id string) (BucketErasure, error) {
		ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", id)}
		return r.EraseBucket(ctx, "acme", ms, []string{id}, filepath.Join(t.TempDir(), "work"), func(int, int) {})
	}

	res, err := erase("nobody")
	require.NoError(t, err)
	require.Equal(t, BucketErasure{Blocks: 3}, res)
	require.Len(t, objects(t, bkt, first.id), 3, "a downsampled block without the cluster stays")

	res, err = erase(gone)
	require.NoError(t, err)
	require.Equal(t, BucketErasure{Blocks: 3, Rewritten: 2, Series: 3, Deleted: 3, Downsampled: 1}, res)
	require.Empty(t, objects(t, bkt, first.id))
	require.Empty(t, grepFiles(t, dir, gone))
	for c := range want {
		want[c] -= 5 // the first window's samples went with the downsampled block
	}
	require.Equal(t, want, readable(t, dir))
	require.Equal(t, 3.0, testutil.ToFloat64(r.m.marked.WithLabelValues(ReasonErasure)))
}
