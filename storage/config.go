package storage

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/common/model"
)

// Bucket types we link. Other objstore providers are deliberately absent.
const (
	BucketFilesystem = "filesystem"
	BucketS3         = "s3"
)

// Config is the `storage:` section of the receiver config. Call SetDefaults,
// then Validate. SetDefaults fills only zero values, so it may run before or
// after decoding; an explicit zero duration therefore means "the default".
type Config struct {
	// OutOfOrderWindow accepts samples this far behind the newest sample of
	// the tenant, so one cluster's backlog lands while others move the head.
	OutOfOrderWindow model.Duration `yaml:"out_of_order_window"`
	// BlockDuration is both min and max block duration: no local leveled
	// compaction, as in Thanos receive; the bucket's compactor does that.
	BlockDuration model.Duration `yaml:"block_duration"`
	// Retention keeps uploaded blocks locally this long. Blocks that are not
	// uploaded are never deleted.
	Retention    model.Duration `yaml:"retention"`
	ShipInterval model.Duration `yaml:"ship_interval"`
	// UploadOnShutdown and FlushOnShutdown default to true (nil means unset).
	UploadOnShutdown *bool `yaml:"upload_on_shutdown"`
	FlushOnShutdown  *bool `yaml:"flush_on_shutdown"`
	// ShutdownUploadTimeout bounds the final upload in Close.
	ShutdownUploadTimeout model.Duration `yaml:"shutdown_upload_timeout"`
	// ExternalLabels go into every uploaded block's thanos.labels (e.g. replica).
	ExternalLabels map[string]string `yaml:"external_labels"`
	// MaxFuture rejects samples further ahead of the receiver's clock.
	MaxFuture model.Duration `yaml:"max_future"`
	// MaxExemplars per tenant; 0 disables exemplar storage.
	MaxExemplars int          `yaml:"max_exemplars"`
	Bucket       BucketConfig `yaml:"bucket"`

	// BucketRetention removes bucket blocks whose max time is older than
	// this; 0 (the default) keeps them forever. Tenants override it.
	BucketRetention model.Duration `yaml:"bucket_retention"`
	// Tenants holds per-tenant overrides of the storage settings.
	Tenants map[string]TenantConfig `yaml:"tenants"`
	// DeletionDelay is the time between a block's deletion-mark.json and its
	// deletion, so running queries and other readers finish with it (Thanos'
	// --delete-delay). An upload without meta.json untouched this long is
	// abandoned and removed too.
	DeletionDelay model.Duration `yaml:"deletion_delay"`
	// LifecycleInterval is how often retention, deletion of marked blocks
	// and compaction run.
	LifecycleInterval model.Duration `yaml:"lifecycle_interval"`
}

// TenantConfig overrides storage settings for one tenant. A nil field
// inherits the global value.
type TenantConfig struct {
	// BucketRetention: 0 keeps the tenant's blocks forever.
	BucketRetention *model.Duration `yaml:"bucket_retention"`
}

// RetentionFor returns the bucket retention of tenant; 0 means forever.
func (c *Config) RetentionFor(tenant string) time.Duration {
	if tc, ok := c.Tenants[tenant]; ok && tc.BucketRetention != nil {
		return time.Duration(*tc.BucketRetention)
	}
	return time.Duration(c.BucketRetention)
}

// HasRetention reports whether any tenant has a bucket retention.
func (c *Config) HasRetention() bool {
	if c.BucketRetention > 0 {
		return true
	}
	for _, tc := range c.Tenants {
		if tc.BucketRetention != nil && *tc.BucketRetention > 0 {
			return true
		}
	}
	return false
}

// BucketConfig is a tagged union: Type selects which section is used.
type BucketConfig struct {
	Type       string           `yaml:"type"`
	Filesystem FilesystemConfig `yaml:"filesystem"`
	S3         S3Config         `yaml:"s3"`
}

// FilesystemConfig is a bucket on local disk. An empty Directory means
// `<storage.path>/bucket`, filled in by Open.
type FilesystemConfig struct {
	Directory string `yaml:"directory"`
}

// S3Config is an S3-compatible bucket. The secret key is read from a file.
type S3Config struct {
	Bucket        string `yaml:"bucket"`
	Endpoint      string `yaml:"endpoint"`
	Region        string `yaml:"region"`
	AccessKey     string `yaml:"access_key"`
	SecretKeyFile string `yaml:"secret_key_file"`
	Insecure      bool   `yaml:"insecure"`
	// BucketLookupType is auto (default), path or virtual-hosted.
	BucketLookupType string `yaml:"bucket_lookup_type"`
}

// tenantLabel is the thanos.labels key carrying the tenant, as Thanos receive names it.
const tenantLabel = "tenant_id"

// SetDefaults fills unset fields with their defaults.
func (c *Config) SetDefaults() {
	setDur := func(d *model.Duration, def time.Duration) {
		if *d == 0 {
			*d = model.Duration(def)
		}
	}
	setDur(&c.OutOfOrderWindow, 6*time.Hour)
	setDur(&c.BlockDuration, 2*time.Hour)
	setDur(&c.Retention, 6*time.Hour)
	setDur(&c.ShipInterval, 30*time.Second)
	setDur(&c.ShutdownUploadTimeout, time.Minute)
	setDur(&c.MaxFuture, 10*time.Minute)
	setDur(&c.DeletionDelay, 48*time.Hour)
	setDur(&c.LifecycleInterval, time.Hour)
	t := true
	if c.UploadOnShutdown == nil {
		c.UploadOnShutdown = &t
	}
	if c.FlushOnShutdown == nil {
		c.FlushOnShutdown = &t
	}
	if c.Bucket.Type == "" {
		c.Bucket.Type = BucketFilesystem
	}
	if c.Bucket.Type == BucketS3 && c.Bucket.S3.BucketLookupType == "" {
		c.Bucket.S3.BucketLookupType = "auto"
	}
}

// Validate reports every problem, each prefixed with its YAML path.
func (c *Config) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("storage.%s: %s", path, fmt.Sprintf(format, args...)))
	}
	positive := func(path string, d model.Duration) {
		if d <= 0 {
			bad(path, "must be positive, got %s", d)
		}
	}
	positive("out_of_order_window", c.OutOfOrderWindow)
	positive("block_duration", c.BlockDuration)
	positive("retention", c.Retention)
	positive("ship_interval", c.ShipInterval)
	positive("shutdown_upload_timeout", c.ShutdownUploadTimeout)
	positive("max_future", c.MaxFuture)
	positive("deletion_delay", c.DeletionDelay)
	positive("lifecycle_interval", c.LifecycleInterval)
	if c.BucketRetention < 0 {
		bad("bucket_retention", "must not be negative, got %s", c.BucketRetention)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Tenants)) {
		if err := validTenant(name); err != nil {
			bad("tenants."+name, "%v", err)
		}
		if r := c.Tenants[name].BucketRetention; r != nil && *r < 0 {
			bad("tenants."+name+".bucket_retention", "must not be negative, got %s", *r)
		}
	}
	if c.BlockDuration > 0 && time.Duration(c.BlockDuration)%time.Minute != 0 {
		bad("block_duration", "must be a whole number of minutes, got %s", c.BlockDuration)
	}
	if c.MaxExemplars < 0 {
		bad("max_exemplars", "must not be negative, got %d", c.MaxExemplars)
	}
	for k, v := range c.ExternalLabels {
		switch {
		case !model.LegacyValidation.IsValidLabelName(k):
			bad("external_labels."+k, "invalid label name")
		case k == tenantLabel:
			bad("external_labels."+k, "reserved: set from the tenant")
		case v == "":
			bad("external_labels."+k, "empty value")
		}
	}
	errs = append(errs, c.Bucket.validate()...)
	return errors.Join(errs...)
}

func (b *BucketConfig) validate() []error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("storage.bucket.%s: %s", path, fmt.Sprintf(format, args...)))
	}
	switch b.Type {
	case BucketFilesystem:
		if b.S3 != (S3Config{}) {
			bad("s3", "set but type is %q", b.Type)
		}
	case BucketS3:
		if b.Filesystem != (FilesystemConfig{}) {
			bad("filesystem", "set but type is %q", b.Type)
		}
		s := b.S3
		if s.Bucket == "" {
			bad("s3.bucket", "required")
		}
		if s.Endpoint == "" {
			bad("s3.endpoint", "required")
		}
		if (s.AccessKey == "") != (s.SecretKeyFile == "") {
			bad("s3.secret_key_file", "access_key and secret_key_file must be set together")
		}
		switch s.BucketLookupType {
		case "", "auto", "path", "virtual-hosted":
		default:
			bad("s3.bucket_lookup_type", "must be auto, path or virtual-hosted, got %q", s.BucketLookupType)
		}
	default:
		bad("type", "must be %q or %q, got %q", BucketFilesystem, BucketS3, b.Type)
	}
	return errs
}
