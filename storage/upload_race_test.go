package storage_test

import (
	"context"
	"encoding/json"
	"io"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/lifecycle"
)

// beforeMetaBucket runs hook once, just before the first meta.json upload:
// what another process does to the bucket while a block is being shipped.
type beforeMetaBucket struct {
	objstore.Bucket
	once sync.Once
	hook func()
}

func (b *beforeMetaBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	if strings.HasSuffix(name, "/meta.json") {
		b.once.Do(b.hook)
	}
	return b.Bucket.Upload(ctx, name, r, opts...)
}

// completeBlocks fails unless every block with a meta.json holds every file
// its meta.json lists, at its size.
func requireCompleteBlocks(t *testing.T, bkt objstore.Bucket) {
	t.Helper()
	ctx := context.Background()
	n := 0
	require.NoError(t, bkt.Iter(ctx, "", func(dir string) error {
		rc, err := bkt.Get(ctx, path.Join(dir, "meta.json"))
		if bkt.IsObjNotFoundErr(err) {
			return nil
		}
		require.NoError(t, err)
		defer rc.Close()
		var m storage.ThanosMeta
		require.NoError(t, json.NewDecoder(rc).Decode(&m))
		n++
		for _, f := range m.Thanos.Files {
			if f.RelPath == "meta.json" {
				continue
			}
			attrs, err := bkt.Attributes(ctx, path.Join(dir, f.RelPath))
			require.NoError(t, err, "block %s has meta.json but lacks %s", dir, f.RelPath)
			require.Equal(t, f.SizeBytes, attrs.Size, "%s/%s", dir, f.RelPath)
		}
		return nil
	}))
	require.Positive(t, n)
}

// An erasure in one tenant deletes the uploads in progress whose index holds
// the erased id, whatever their tenant. A block of another tenant holding
// the same id string, shipped meanwhile, must not be taken for uploaded with
// objects missing: its local copy would then be deleted after retention and
// the bucket's broken copy would be the only one.
func TestShipperSurvivesErasureOfItsUploadInProgress(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fs, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	cfg := storage.Config{}
	cfg.Bucket.Type = storage.BucketFilesystem
	cfg.Bucket.Filesystem.Directory = dir
	cfg.SetDefaults()
	runner := lifecycle.New(discard, nil, fs, cfg, lifecycle.Options{})
	const id = "cluster-in-two-tenants"
	var eraseErr error
	bkt := &beforeMetaBucket{Bucket: fs, hook: func() {
		ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", id)}
		_, eraseErr = runner.EraseBucket(ctx, "acme", ms, []string{id}, t.TempDir(), func(int, int) {})
	}}
	db, err := storage.OpenWithBucket(discard, nil, t.TempDir(), cfg, bkt, time.Now)
	require.NoError(t, err)
	defer db.Close()
	ts := time.Now().Add(-3 * time.Hour).UnixMilli()
	_, err = db.Write(ctx, "other", []prompb.TimeSeries{
		{Labels: []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: id}}, Samples: []prompb.Sample{{Timestamp: ts, Value: 1}}},
		{Labels: []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: "keep"}}, Samples: []prompb.Sample{{Timestamp: ts, Value: 1}}},
	})
	require.NoError(t, err)
	require.NoError(t, db.Flush())

	_ = db.Ship(ctx) // may report the interrupted upload
	require.NoError(t, eraseErr)
	require.NoError(t, db.Ship(ctx)) // the next round repairs it
	requireCompleteBlocks(t, fs)
}
