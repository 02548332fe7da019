package storage_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/storage"
)

// An upload to a filesystem bucket that is no longer a directory fails
// with an error that names the object's path once, not "stat X: stat X:".
func TestFilesystemBucketErrorNamesThePathOnce(t *testing.T) {
	dir, bktDir := t.TempDir(), filepath.Join(t.TempDir(), "bkt")
	cfg := storage.Config{Bucket: storage.BucketConfig{Type: storage.BucketFilesystem, Filesystem: storage.FilesystemConfig{Directory: bktDir}}}
	db, err := storage.Open(discard, prometheus.NewRegistry(), dir, cfg)
	require.NoError(t, err)
	writeFixture(t, db)
	require.NoError(t, os.Remove(bktDir))
	require.NoError(t, os.WriteFile(bktDir, []byte("x"), 0o600))

	err = db.Close()
	require.Error(t, err)
	left := db.NotUploaded()
	require.NotEmpty(t, left)
	_, id, _ := strings.Cut(left[0], "/")
	meta := filepath.Join(bktDir, id, "meta.json")
	require.Contains(t, err.Error(), "check meta.json: stat "+meta+": not a directory")
	require.Equal(t, 1, strings.Count(err.Error(), meta), err.Error())
}
