package storage_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
)

// writeBlock writes one sample of tenant acme three hours ago and flushes
// it into a local block, whose ULID it returns.
func writeBlock(t *testing.T, db *storage.DB) ulid.ULID {
	t.Helper()
	_, err := db.Write(context.Background(), "acme", []prompb.TimeSeries{{
		Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: "c1"}},
		Samples: []prompb.Sample{{Timestamp: time.Now().Add(-3 * time.Hour).UnixMilli(), Value: 1}},
	}})
	require.NoError(t, err)
	require.NoError(t, db.Flush())
	ids := db.LocalBlocks("acme")
	require.Len(t, ids, 1)
	return ids[0]
}

// requireMetaNames checks that the bucket's meta.json of id decodes and
// names id.
func requireMetaNames(t *testing.T, bkt objstore.BucketReader, id ulid.ULID) {
	t.Helper()
	rc, err := bkt.Get(context.Background(), path.Join(id.String(), "meta.json"))
	require.NoError(t, err)
	defer rc.Close()
	var m storage.ThanosMeta
	require.NoError(t, json.NewDecoder(rc).Decode(&m))
	require.Equal(t, id, m.ULID)
}

// TestShipperChecksMetaInBucket checks that a block counts as already
// uploaded only when the bucket holds a meta.json that decodes and names
// it; a missing, empty, torn or foreign one makes the shipper upload the
// whole block again, meta.json last.
func TestShipperChecksMetaInBucket(t *testing.T) {
	valid := func(id ulid.ULID) []byte {
		b, err := json.Marshal(storage.ThanosMeta{BlockMeta: tsdb.BlockMeta{ULID: id, Version: 1}})
		require.NoError(t, err)
		return b
	}
	for _, tc := range []struct {
		name     string
		meta     func(id ulid.ULID) []byte // nil: no meta.json in the bucket
		uploaded bool                      // the block counts as in the bucket
	}{
		{name: "absent"},
		{name: "empty", meta: func(ulid.ULID) []byte { return []byte{} }},
		{name: "torn", meta: func(id ulid.ULID) []byte { b := valid(id); return b[:len(b)/2] }},
		{name: "names another block", meta: func(ulid.ULID) []byte { return valid(ulid.Make()) }},
		{name: "valid", meta: valid, uploaded: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner := objstore.NewInMemBucket()
			bkt := &recordingBucket{Bucket: inner}
			db := openTest(t, t.TempDir(), testConfig(), bkt, nil)
			id := writeBlock(t, db)
			if tc.meta != nil {
				require.NoError(t, inner.Upload(context.Background(), path.Join(id.String(), "meta.json"), bytes.NewReader(tc.meta(id))))
			}

			require.NoError(t, db.Ship(context.Background()))
			if tc.uploaded {
				require.Empty(t, bkt.uploaded())
				return
			}
			require.Contains(t, bkt.uploaded(), path.Join(id.String(), "index"))
			requireMetaLast(t, bkt.uploaded())
			requireMetaNames(t, inner, id)
		})
	}
}

// fullDiskBucket fails the first meta.json upload after leaving the object
// empty, as the filesystem bucket does on a full disk (the file is created,
// then the write fails).
type fullDiskBucket struct {
	objstore.Bucket
	failed bool
}

func (b *fullDiskBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	if strings.HasSuffix(name, "/meta.json") && !b.failed {
		b.failed = true
		if err := b.Bucket.Upload(ctx, name, bytes.NewReader(nil)); err != nil {
			return err
		}
		return errors.New("write meta.json: no space left on device")
	}
	return b.Bucket.Upload(ctx, name, r, opts...)
}

// TestShipperRetriesAfterTornMetaOnFilesystem replays a full disk on the
// filesystem bucket during the meta.json upload: the next round uploads the
// block again, so the bucket store reads it rather than failing its sync.
func TestShipperRetriesAfterTornMetaOnFilesystem(t *testing.T) {
	dir := t.TempDir()
	fs, err := filesystem.NewBucket(filepath.Join(dir, "bucket"))
	require.NoError(t, err)
	db := openTest(t, filepath.Join(dir, "data"), testConfig(), &fullDiskBucket{Bucket: fs}, nil)
	ctx := context.Background()
	id := writeBlock(t, db)

	require.ErrorContains(t, db.Ship(ctx), "no space left on device")
	require.NoError(t, db.Ship(ctx))
	requireMetaNames(t, fs, id)

	st, err := bucketstore.New(discard, nil, fs, t.TempDir(), bucketstore.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Close()) })
	require.NoError(t, st.Sync(ctx))
	blocks := st.Blocks("acme", 0, time.Now().UnixMilli())
	require.Len(t, blocks, 1)
	require.Equal(t, id, blocks[0].ULID)
}
