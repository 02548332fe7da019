package storage

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/atomicfile"
)

// A process killed while writing the deny list or a tenant's shipper or
// metadata state leaves a temporary file: the next open removes it, and
// the state it was to replace still loads.
func TestOpenRemovesTemporaryFilesOfACrash(t *testing.T) {
	dir := t.TempDir()
	var cfg Config
	cfg.SetDefaults()
	open := func() *DB {
		db, err := openWithBucket(slog.New(slog.DiscardHandler), nil, dir, cfg, objstore.NewInMemBucket(), time.Now)
		require.NoError(t, err)
		return db
	}
	db := open()
	_, err := db.Write(context.Background(), "t", []prompb.TimeSeries{{
		Labels:  []prompb.Label{{Name: "__name__", Value: "m"}},
		Samples: []prompb.Sample{{Value: 1, Timestamp: time.Now().UnixMilli()}},
	}})
	require.NoError(t, err)
	require.NoError(t, db.Deny("t", "c1", ""))
	require.NoError(t, db.Close())
	tenantDir := filepath.Join(dir, "tenants", "t")
	for _, path := range []string{filepath.Join(dir, denyFile), filepath.Join(tenantDir, shipperFile), filepath.Join(tenantDir, metadataFile)} {
		_, err := atomicfile.Prepare(path, []byte("torn"), 0o640)
		require.NoError(t, err)
	}

	db = open()
	defer func() { require.NoError(t, db.Close()) }()
	for _, d := range []string{dir, tenantDir} {
		entries, err := os.ReadDir(d)
		require.NoError(t, err)
		for _, e := range entries {
			require.False(t, strings.HasSuffix(e.Name(), ".tmp"), "%s left by the crash in %s", e.Name(), d)
		}
	}
	require.True(t, db.Denied("t", "c1"), "the deny list is untouched")
}
