package storage

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
)

// openInternal opens a DB with the default config on an in-memory bucket,
// for the package's own tests, and closes it at cleanup.
func openInternal(t *testing.T) *DB {
	t.Helper()
	var cfg Config
	cfg.SetDefaults()
	db, err := openWithBucket(slog.New(slog.DiscardHandler), nil, t.TempDir(), cfg, objstore.NewInMemBucket(), time.Now)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}
