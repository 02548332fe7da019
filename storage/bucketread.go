package storage

import (
	"fmt"
	"log/slog"

	"github.com/oklog/ulid/v2"
	"github.com/thanos-io/objstore"
)

// OpenBucketReader opens the bucket configured by cfg (defaults applied, as
// after Config.SetDefaults) for reading blocks, e.g. by the bucket store.
// It is a separate client from the shipper's; the caller closes it.
func OpenBucketReader(logger *slog.Logger, cfg BucketConfig, storageDir string) (objstore.Bucket, error) {
	b, err := openBucket(logger, cfg, storageDir)
	if err != nil {
		return nil, err
	}
	full, ok := b.(objstore.Bucket)
	if !ok { // every provider we link is a full objstore.Bucket
		_ = b.Close()
		return nil, fmt.Errorf("bucket type %q cannot be read", cfg.Type)
	}
	return full, nil
}

// LocalBlocks returns the ULIDs of the tenant's blocks on local disk, so a
// reader of the bucket can skip the copies it already has. Unknown tenants
// (and a closed DB) have none.
func (db *DB) LocalBlocks(tenant string) []ulid.ULID {
	t, release, err := db.readTenant(tenant)
	if err != nil {
		return nil
	}
	defer release()
	if t == nil {
		return nil
	}
	blocks := t.db.Blocks()
	ids := make([]ulid.ULID, 0, len(blocks))
	for _, b := range blocks {
		ids = append(ids, b.Meta().ULID)
	}
	return ids
}
