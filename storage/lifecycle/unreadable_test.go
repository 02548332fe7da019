package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
)

var errSlowDown = errors.New("503 SlowDown")

// flakyBucket fails the next Get of the object fail, once, as an S3 503.
type flakyBucket struct {
	objstore.Bucket
	mu   sync.Mutex
	fail string
}

func (b *flakyBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	b.mu.Lock()
	failing := name == b.fail
	if failing {
		b.fail = ""
	}
	b.mu.Unlock()
	if failing {
		return nil, errSlowDown
	}
	return b.Bucket.Get(ctx, name)
}

// TestUnreadableMetaLeavesBlockAlone checks that a complete block whose
// meta.json cannot be read (a 503) or decoded (empty, torn, another
// block's) is never taken for an abandoned upload, even with its objects
// older than the deletion delay, while a real abandoned upload next to it
// is still deleted.
func TestUnreadableMetaLeavesBlockAlone(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transient bool // the next run reads it fine
		meta      func(id ulid.ULID, good []byte) []byte
	}{
		{name: "get fails once", transient: true},
		{name: "empty", meta: func(ulid.ULID, []byte) []byte { return nil }},
		{name: "torn", meta: func(_ ulid.ULID, good []byte) []byte { return good[:len(good)/2] }},
		{name: "names another block", meta: func(id ulid.ULID, good []byte) []byte {
			return bytes.ReplaceAll(good, []byte(id.String()), []byte(ulid.Make().String()))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			mem := objstore.NewInMemBucket()
			bkt := &flakyBucket{Bucket: mem}
			now := time.Now()
			id := putBlock(t, mem, "acme", now.Add(-4*time.Hour), now.Add(-2*time.Hour))
			metaName := path.Join(id.String(), MetaFile)
			if tc.transient {
				bkt.fail = metaName
			} else {
				good := getObject(t, mem, metaName)
				require.NoError(t, mem.Upload(ctx, metaName, bytes.NewReader(tc.meta(id, good))))
			}
			abandoned := ulid.Make()
			require.NoError(t, mem.Upload(ctx, path.Join(abandoned.String(), "index"), bytes.NewReader([]byte("x"))))

			cfg := storage.Config{} // no retention: keep forever
			cfg.SetDefaults()
			cfg.DeletionDelay = model.Duration(48 * time.Hour)
			r := New(discard, nil, bkt, cfg, Options{Now: func() time.Time { return now.Add(72 * time.Hour) }})

			err := r.RunOnce(ctx)
			require.ErrorContains(t, err, id.String())
			require.Len(t, objects(t, mem, id), 3, "the block is left whole")
			require.Empty(t, objects(t, mem, abandoned), "a real abandoned upload still goes")
			require.Equal(t, 1.0, testutil.ToFloat64(r.m.partialDeleted))
			require.Equal(t, 1.0, testutil.ToFloat64(r.m.failures.WithLabelValues("read_meta")))
			require.Equal(t, 1.0, testutil.ToFloat64(r.m.runs.WithLabelValues("failure")))

			err = r.RunOnce(ctx)
			require.Len(t, objects(t, mem, id), 3)
			if tc.transient {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, id.String())
			require.Equal(t, 2.0, testutil.ToFloat64(r.m.failures.WithLabelValues("read_meta")))
		})
	}
}

// TestEraseBucketRefusesUnreadableBlock checks that an erasure does not
// run, and changes nothing, while a block it cannot read may hold the series.
func TestEraseBucketRefusesUnreadableBlock(t *testing.T) {
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	now := time.Now()
	torn := putBlock(t, bkt, "acme", now.Add(-4*time.Hour), now.Add(-2*time.Hour))
	metaName := path.Join(torn.String(), MetaFile)
	require.NoError(t, bkt.Upload(ctx, metaName, bytes.NewReader(getObject(t, bkt, metaName)[:10])))
	marked := putBlock(t, bkt, "acme", now.Add(-6*time.Hour), now.Add(-4*time.Hour))
	require.NoError(t, markForDeletion(ctx, bkt, marked, "test", now))
	cfg := storage.Config{}
	cfg.SetDefaults()
	r := New(discard, nil, bkt, cfg, Options{})
	ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", "c1")}
	_, err := r.EraseBucket(ctx, "acme", ms, []string{"c1"}, filepath.Join(t.TempDir(), "work"), func(int, int) {})
	require.ErrorContains(t, err, torn.String())
	require.Len(t, objects(t, bkt, torn), 3)
	require.Len(t, objects(t, bkt, marked), 4, "nothing is deleted before every block is read")
	require.Equal(t, 1.0, testutil.ToFloat64(r.m.failures.WithLabelValues("read_meta")))
}

func getObject(t *testing.T, bkt objstore.BucketReader, name string) []byte {
	t.Helper()
	rc, err := bkt.Get(context.Background(), name)
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return b
}
