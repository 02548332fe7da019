package bucketstore_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
)

// TestSyncSkipsInvalidMeta checks that blocks whose meta.json is torn or
// names another block are skipped and counted without failing the sync,
// and that a block is read once its meta.json is valid.
func TestSyncSkipsInvalidMeta(t *testing.T) {
	bucketDir := t.TempDir()
	replica(t, bucketDir, "r0", func(db *storage.DB) {
		_, err := db.Write(context.Background(), "acme", []prompb.TimeSeries{series("c1", []int64{time.Now().Add(-time.Minute).UnixMilli()}, func(int64) float64 { return 1 })})
		require.NoError(t, err)
	})
	entries, err := os.ReadDir(bucketDir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	good := entries[0].Name()
	goodMeta, err := os.ReadFile(filepath.Join(bucketDir, good, "meta.json"))
	require.NoError(t, err)
	// copyBlock copies the good block's objects under a new ULID with the
	// given meta.json.
	copyBlock := func(meta []byte) string {
		id := ulid.Make().String()
		require.NoError(t, os.CopyFS(filepath.Join(bucketDir, id), os.DirFS(filepath.Join(bucketDir, good))))
		require.NoError(t, os.WriteFile(filepath.Join(bucketDir, id, "meta.json"), meta, 0o644))
		return id
	}
	torn := copyBlock(goodMeta[:len(goodMeta)/2])
	copyBlock(goodMeta) // names the good block

	bkt, err := filesystem.NewBucket(bucketDir)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	store, err := bucketstore.New(discard, reg, bkt, t.TempDir(), bucketstore.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, store.Close()) }()
	requireMetrics := func(blocks, invalid int) {
		t.Helper()
		require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP phonehome_bucketstore_blocks Blocks in the bucket that queries can read, as of the last sync.
# TYPE phonehome_bucketstore_blocks gauge
phonehome_bucketstore_blocks `+strconv.Itoa(blocks)+`
# HELP phonehome_bucketstore_invalid_meta_total Reads of a block's meta.json that did not decode or named another block; the block is skipped until a sync reads a valid one.
# TYPE phonehome_bucketstore_invalid_meta_total counter
phonehome_bucketstore_invalid_meta_total `+strconv.Itoa(invalid)+`
`), "phonehome_bucketstore_blocks", "phonehome_bucketstore_invalid_meta_total"))
	}

	require.NoError(t, store.Sync(context.Background()))
	requireMetrics(1, 2)
	require.Len(t, store.Blocks("acme", 0, time.Now().UnixMilli()), 1)
	require.True(t, store.SyncedSince(time.Now().Add(-time.Minute)))

	// The uploader retries: the torn block becomes valid and is read.
	fixed := bytes.ReplaceAll(goodMeta, []byte(good), []byte(torn))
	require.NoError(t, os.WriteFile(filepath.Join(bucketDir, torn, "meta.json"), fixed, 0o644))
	require.NoError(t, store.Sync(context.Background()))
	requireMetrics(2, 3)
}
