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

// Flush persists every tenant's head into blocks, as Close does.
func (db *DB) Flush() error {
	for _, t := range db.snapshotTenants() {
		if err := flushHead(t.db, db.blockMs()); err != nil {
			return err
		}
	}
	return nil
}

const ShipperFile = shipperFile
