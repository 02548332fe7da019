package bucketstore_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
)

// TestMarkedAndReplacedBlocksAreNotRead: a block with a deletion mark is
// dropped at the next sync (and from the cache), and a block whose sources
// are all in another block's sources (a compactor's or an erasure's result)
// is not read next to it.
func TestMarkedAndReplacedBlocksAreNotRead(t *testing.T) {
	bucketDir := t.TempDir()
	now := recentInOneBlock(time.Minute)
	ts := []int64{now - 30_000, now}
	one := func(int64) float64 { return 1 }
	for _, r := range []string{"r0", "r1"} {
		replica(t, bucketDir, r, func(db *storage.DB) {
			_, err := db.Write(context.Background(), "acme", []prompb.TimeSeries{series(r, ts, one)})
			require.NoError(t, err)
		})
	}
	bkt, err := filesystem.NewBucket(bucketDir)
	require.NoError(t, err)
	store, err := bucketstore.New(discard, nil, bkt, filepath.Join(t.TempDir(), "cache"), bucketstore.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, store.Close()) }()
	ctx := context.Background()
	require.NoError(t, store.Sync(ctx))
	blocks := store.Blocks("acme", math.MinInt64, math.MaxInt64)
	require.Len(t, blocks, 2)
	read := func() int {
		n := 0
		for _, q := range store.Queriers("acme", math.MinInt64, math.MaxInt64, nil) {
			n += len(readAll(t, q))
		}
		return n
	}
	require.Equal(t, 2, read())
	require.Equal(t, 2.0, testutil.ToFloat64(store.CacheBlocksGauge()))

	// A third block replacing both (as a compactor would write it): only it is read.
	merged := copyBlock(t, bucketDir, blocks[0].ULID, func(m *storage.ThanosMeta) {
		m.Compaction.Sources = []ulid.ULID{blocks[0].ULID, blocks[1].ULID}
		m.Compaction.Level = 2
	})
	require.NoError(t, store.Sync(ctx))
	got := store.Blocks("acme", math.MinInt64, math.MaxInt64)
	require.Len(t, got, 1)
	require.Equal(t, merged, got[0].ULID)

	// A rewrite with the same sources replaces it in turn (the newer ULID wins).
	rewrite := copyBlock(t, bucketDir, merged, nil)
	require.NoError(t, store.Sync(ctx))
	got = store.Blocks("acme", math.MinInt64, math.MaxInt64)
	require.Len(t, got, 1)
	require.Equal(t, rewrite, got[0].ULID)

	// Marked: gone from the index and, unused, from the cache.
	for _, id := range []ulid.ULID{blocks[0].ULID, rewrite} {
		require.NoError(t, os.WriteFile(filepath.Join(bucketDir, id.String(), "deletion-mark.json"),
			[]byte(`{"id":"`+id.String()+`","deletion_time":1,"version":1}`), 0o644))
	}
	require.NoError(t, store.Sync(ctx))
	got = store.Blocks("acme", math.MinInt64, math.MaxInt64)
	require.Len(t, got, 1)
	require.Equal(t, merged, got[0].ULID)
	require.Equal(t, 1.0, testutil.ToFloat64(store.CacheBlocksGauge()), "the marked block left the cache")
	require.Equal(t, 1, read(), "the merged block holds only r0's series in this test")
}

// copyBlock copies block id in the bucket directory under a new ULID, with
// its meta.json edited by edit (sources default to the copied block's).
func copyBlock(t *testing.T, bucketDir string, id ulid.ULID, edit func(*storage.ThanosMeta)) ulid.ULID {
	t.Helper()
	nid := ulid.Make()
	src, dst := filepath.Join(bucketDir, id.String()), filepath.Join(bucketDir, nid.String())
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	b, err := os.ReadFile(filepath.Join(dst, "meta.json"))
	require.NoError(t, err)
	var m storage.ThanosMeta
	require.NoError(t, json.Unmarshal(b, &m))
	m.ULID = nid
	if edit != nil {
		edit(&m)
	}
	b, err = json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dst, "meta.json"), b, 0o644))
	_ = os.Remove(filepath.Join(dst, "deletion-mark.json"))
	return nid
}
