package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
)

// completingBucket uploads block id's meta.json just before the nth
// listing of the block's objects: a shipper finishing its upload between
// a scan that found the block without meta.json and its deletion.
type completingBucket struct {
	objstore.Bucket
	id   ulid.ULID
	n    int
	meta []byte
}

func (b *completingBucket) Iter(ctx context.Context, dir string, f func(string) error, opts ...objstore.IterOption) error {
	if dir == b.id.String() {
		if b.n--; b.n == 0 {
			if err := b.Upload(ctx, path.Join(dir, MetaFile), bytes.NewReader(b.meta)); err != nil {
				return err
			}
		}
	}
	return b.Bucket.Iter(ctx, dir, f, opts...)
}

// putPartial uploads a block of tenant without its meta.json, its objects
// last modified at mtime, and returns its id and the meta.json to finish it.
func putPartial(t *testing.T, dir string, bkt objstore.Bucket, tenant, index string, mtime time.Time) (ulid.ULID, []byte) {
	t.Helper()
	ctx := context.Background()
	id := ulid.Make()
	for name, body := range map[string]string{"index": index, "chunks/000001": "chunks"} {
		require.NoError(t, bkt.Upload(ctx, path.Join(id.String(), name), bytes.NewReader([]byte(body))))
		require.NoError(t, os.Chtimes(filepath.Join(dir, id.String(), name), mtime, mtime))
	}
	m := storage.ThanosMeta{BlockMeta: tsdb.BlockMeta{ULID: id, MinTime: 0, MaxTime: 1, Version: 1}}
	m.Thanos.Labels = map[string]string{tenantLabel: tenant}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return id, b
}

// A shipper resumes an upload abandoned longer than the deletion delay (a
// receiver back after days): a run that took it for abandoned must not
// delete the block it finds completed.
func TestAbandonedUploadCompletedMeanwhileIsKept(t *testing.T) {
	dir := t.TempDir()
	fsb, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	now := time.Now()
	id, meta := putPartial(t, dir, fsb, "acme", "index", now.Add(-3*time.Hour))
	cfg := storage.Config{}
	cfg.SetDefaults()
	cfg.DeletionDelay = model.Duration(time.Hour)
	bkt := &completingBucket{Bucket: fsb, id: id, n: 2, meta: meta} // lastModified lists first
	require.NoError(t, New(discard, nil, bkt, cfg, Options{Now: func() time.Time { return now }}).RunOnce(context.Background()))
	require.Len(t, objects(t, fsb, id), 3, "the completed block is kept whole")
}

// An erasure deletes uploads without meta.json whose index holds the id,
// at once and whatever their tenant: one completed meanwhile (here another
// tenant's, holding the same id string) is a block, not an upload to drop.
func TestEraseBucketKeepsUploadCompletedMeanwhile(t *testing.T) {
	dir := t.TempDir()
	fsb, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	id, meta := putPartial(t, dir, fsb, "other", "index of "+gone, time.Now())
	cfg := storage.Config{}
	cfg.SetDefaults()
	bkt := &completingBucket{Bucket: fsb, id: id, n: 1, meta: meta}
	ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", gone)}
	r := New(discard, nil, bkt, cfg, Options{})
	_, err = r.EraseBucket(context.Background(), "acme", ms, []string{gone}, t.TempDir(), func(int, int) {})
	require.ErrorContains(t, err, "completed", "the job is retried with a fresh scan")
	require.Len(t, objects(t, fsb, id), 3, "the completed block is kept whole")
	_, err = r.EraseBucket(context.Background(), "acme", ms, []string{gone}, t.TempDir(), func(int, int) {})
	require.NoError(t, err)
	require.Len(t, objects(t, fsb, id), 3, "another tenant's block is not the erasure's")
}
