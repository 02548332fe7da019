package erasure

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/storage"
)

// failingDB is the receiver's storage whose erasure fails, as a resumed
// job's does when the disk is still at fault.
type failingDB struct{ *storage.DB }

func (failingDB) EraseLocal(context.Context, string, []*labels.Matcher, []string) (storage.LocalErasure, error) {
	return storage.LocalErasure{}, errors.New("disk on fire")
}

// The receiver's wiring (storage.DB.HoldShipping(Eraser.ShippingHeld)): while
// a job's local step fails, the shutdown's flush and upload ship the other
// tenant's blocks and none of the erasing tenant's, which still hold the
// cluster; once a later attempt erased the local storage, they are shipped
// without it.
func TestFailingJobKeepsTheClusterOutOfTheBucket(t *testing.T) {
	dir, bucketDir := t.TempDir(), t.TempDir()
	var cfg storage.Config
	cfg.Bucket.Type = storage.BucketFilesystem
	cfg.Bucket.Filesystem.Directory = bucketDir
	logger := slog.New(slog.DiscardHandler)
	open := func(local func(*storage.DB) Local) (*storage.DB, *Eraser) {
		db, err := storage.Open(logger, nil, filepath.Join(dir, "tsdb"), cfg)
		require.NoError(t, err)
		e, err := New(logger, nil, local(db), &fakeBucket{}, filepath.Join(dir, "erasure"), Options{})
		require.NoError(t, err)
		db.HoldShipping(e.ShippingHeld)
		return db, e
	}
	db, e := open(func(db *storage.DB) Local { return failingDB{db} })
	at := time.Now().Add(-time.Hour).UnixMilli()
	for tenant, ids := range map[string][]string{"acme": {secretID, "keep1"}, "other": {"keep9"}} {
		var ss []prompb.TimeSeries
		for _, id := range ids {
			ss = append(ss, prompb.TimeSeries{
				Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: id}},
				Samples: []prompb.Sample{{Timestamp: at, Value: 1}},
			})
		}
		_, err := db.Write(context.Background(), tenant, ss)
		require.NoError(t, err)
	}
	st, err := e.Submit(Request{Tenant: "acme", ClusterID: secretID})
	require.NoError(t, err)
	require.Error(t, e.Do(context.Background(), st.ID))
	require.NoError(t, db.Close()) // flushes the head into blocks, uploads what it may
	require.True(t, holds(t, bucketDir, "keep9"), "the other tenant ships")
	require.False(t, holds(t, bucketDir, "keep1"), "the erasing tenant does not")
	require.False(t, holds(t, bucketDir, secretID))

	db, e = open(func(db *storage.DB) Local { return db })
	require.True(t, e.ShippingHeld("acme"), "after a restart too")
	require.NoError(t, e.Do(context.Background(), st.ID))
	require.NoError(t, db.Close())
	require.True(t, holds(t, bucketDir, "keep1"), "shipped once the local storage is erased")
	require.False(t, holds(t, bucketDir, secretID))
}

// holds reports whether a file under dir contains s.
func holds(t *testing.T, dir, s string) bool {
	t.Helper()
	found := false
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		found = found || bytes.Contains(b, []byte(s))
		return err
	}))
	return found
}
