package storage

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"
	"github.com/thanos-io/objstore/providers/s3"
)

// bucket is the subset of objstore.Bucket the shipper uses.
type bucket interface {
	Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error
	Get(ctx context.Context, name string) (io.ReadCloser, error) // meta.json, to check a shipped block (inBucket)
	// Attributes checks the files of a shipped block (filesInBucket).
	Attributes(ctx context.Context, name string) (objstore.ObjectAttributes, error)
	IsObjNotFoundErr(err error) bool
	Close() error
}

// openBucket builds the configured provider. Only filesystem and s3 are
// linked; objstore's client factory would link every cloud SDK.
func openBucket(logger *slog.Logger, cfg BucketConfig, storageDir string) (bucket, error) {
	switch cfg.Type {
	case BucketFilesystem:
		dir := cfg.Filesystem.Directory
		if dir == "" {
			dir = filepath.Join(storageDir, "bucket")
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create bucket directory: %w", err)
		}
		b, err := filesystem.NewBucket(dir)
		if err != nil {
			return nil, fmt.Errorf("open filesystem bucket %s: %w", dir, err)
		}
		return fsBucket{b}, nil // errors that name their file once
	case BucketS3:
		c := cfg.S3
		sc := s3.DefaultConfig
		sc.PutUserMetadata = map[string]string{}
		sc.Bucket, sc.Endpoint, sc.Region, sc.Insecure = c.Bucket, c.Endpoint, c.Region, c.Insecure
		sc.AccessKey = c.AccessKey
		if c.SecretKeyFile != "" {
			secret, err := os.ReadFile(c.SecretKeyFile)
			if err != nil {
				return nil, fmt.Errorf("read storage.bucket.s3.secret_key_file: %w", err)
			}
			sc.SecretKey = strings.TrimSpace(string(secret))
		}
		switch c.BucketLookupType {
		case "path":
			sc.BucketLookupType = s3.PathLookup
		case "virtual-hosted":
			sc.BucketLookupType = s3.VirtualHostLookup
		default:
			sc.BucketLookupType = s3.AutoLookup
		}
		b, err := s3.NewBucketWithConfig(goKitLogger{logger}, sc, "phonehome-receiver", nil)
		if err != nil {
			return nil, fmt.Errorf("open s3 bucket %s: %w", c.Bucket, err)
		}
		return b, nil
	default:
		return nil, fmt.Errorf("unknown bucket type %q", cfg.Type)
	}
}

// goKitLogger adapts slog to the go-kit interface the s3 provider wants,
// at debug level: the provider only logs tracing details.
type goKitLogger struct{ l *slog.Logger }

func (g goKitLogger) Log(keyvals ...any) error {
	g.l.Debug("s3", keyvals...)
	return nil
}
