package storage

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/thanos-io/objstore"
)

// OpenWithBucket lets external tests inject a bucket and a clock.
func OpenWithBucket(logger *slog.Logger, reg prometheus.Registerer, dir string, cfg Config, bkt objstore.Bucket, now func() time.Time) (*DB, error) {
	cfg.SetDefaults()
	return openWithBucket(logger, reg, dir, cfg, bkt, now)
}

// Ship runs one shipping round.
func (db *DB) Ship(ctx context.Context) error { return db.ship(ctx) }
