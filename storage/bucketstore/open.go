package bucketstore

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/phonehome/phonehome/storage"
)

// CacheDir is the block cache's directory under --storage.path.
const CacheDir = "bucket-cache"

// Open opens the bucket described by bucket (the storage: section, defaults
// applied) for reading and a Store over it, caching blocks in
// <storagePath>/bucket-cache. It returns nil if cfg disables the store. The
// Store owns the bucket client and closes it in Close.
func Open(logger *slog.Logger, reg prometheus.Registerer, storagePath string, bucket storage.BucketConfig, cfg Config) (*Store, error) {
	if cfg.Enabled != nil && !*cfg.Enabled {
		return nil, nil
	}
	bkt, err := storage.OpenBucketReader(logger, bucket, storagePath)
	if err != nil {
		return nil, fmt.Errorf("open bucket for reading: %w", err)
	}
	s, err := New(logger, reg, bkt, filepath.Join(storagePath, CacheDir), Options{
		SyncInterval:    time.Duration(cfg.SyncInterval),
		CacheMaxBytes:   int64(cfg.CacheMaxBytes),
		DownloadTimeout: time.Duration(cfg.DownloadTimeout),
	})
	if err != nil {
		_ = bkt.Close()
		return nil, err
	}
	s.closer = bkt
	return s, nil
}

var _ io.Closer = (*Store)(nil)
