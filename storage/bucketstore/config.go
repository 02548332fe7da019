package bucketstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/alecthomas/units"
	"github.com/prometheus/common/model"
)

// Config is the `bucket_store:` section of the receiver config: reading the
// blocks every replica uploaded to the bucket. Call SetDefaults, then Validate.
type Config struct {
	// Enabled defaults to true (nil means unset). Without it, queries see
	// only this receiver's local disk.
	Enabled *bool `yaml:"enabled"`
	// SyncInterval is how often block metadata is listed from the bucket.
	SyncInterval model.Duration `yaml:"sync_interval"`
	// CacheMaxBytes is the disk budget of downloaded blocks. The least
	// recently used blocks are evicted beyond it; blocks in use by a query
	// are not, and while they fill it no other block is downloaded (its
	// data is missing from the answer, with a warning), so the cache
	// exceeds it by the downloads under way at most.
	CacheMaxBytes units.Base2Bytes `yaml:"cache_max_bytes"`
	// DownloadTimeout bounds fetching one block.
	DownloadTimeout model.Duration `yaml:"download_timeout"`
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.Enabled == nil {
		t := true
		c.Enabled = &t
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = model.Duration(time.Minute)
	}
	if c.CacheMaxBytes == 0 {
		c.CacheMaxBytes = 10 * units.GiB
	}
	if c.DownloadTimeout == 0 {
		c.DownloadTimeout = model.Duration(5 * time.Minute)
	}
}

// Validate reports every problem with its YAML path.
func (c *Config) Validate() error {
	var errs []error
	if c.SyncInterval < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("bucket_store.sync_interval: %s is shorter than 1s", c.SyncInterval))
	}
	if c.CacheMaxBytes < units.MiB {
		errs = append(errs, fmt.Errorf("bucket_store.cache_max_bytes: %s is smaller than 1MiB", c.CacheMaxBytes))
	}
	if c.DownloadTimeout < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("bucket_store.download_timeout: %s is shorter than 1s", c.DownloadTimeout))
	}
	return errors.Join(errs...)
}
