package storage_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/phonehome/phonehome/storage"
)

func decode(t *testing.T, in string) storage.Config {
	t.Helper()
	var c storage.Config
	dec := yaml.NewDecoder(strings.NewReader(in))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&c))
	c.SetDefaults()
	return c
}

func TestConfigDefaults(t *testing.T) {
	c := decode(t, "external_labels: {replica: r1}\n")
	require.NoError(t, c.Validate())
	require.Equal(t, model.Duration(6*time.Hour), c.OutOfOrderWindow)
	require.Equal(t, model.Duration(2*time.Hour), c.BlockDuration)
	require.Equal(t, model.Duration(6*time.Hour), c.Retention)
	require.Equal(t, model.Duration(30*time.Second), c.ShipInterval)
	require.Equal(t, model.Duration(10*time.Minute), c.MaxFuture)
	require.Equal(t, model.Duration(time.Minute), c.ShutdownUploadTimeout)
	require.True(t, *c.UploadOnShutdown)
	require.True(t, *c.FlushOnShutdown)
	require.Equal(t, storage.BucketFilesystem, c.Bucket.Type)
	require.Zero(t, c.MaxExemplars)

	c = decode(t, "upload_on_shutdown: false\nflush_on_shutdown: false\nship_interval: 5s\n")
	require.False(t, *c.UploadOnShutdown)
	require.False(t, *c.FlushOnShutdown)
	require.Equal(t, model.Duration(5*time.Second), c.ShipInterval)
}

func TestConfigUnknownKey(t *testing.T) {
	var c storage.Config
	dec := yaml.NewDecoder(strings.NewReader("bucket: {type: s3, s3: {secret_key: x}}\n"))
	dec.KnownFields(true)
	require.ErrorContains(t, dec.Decode(&c), "secret_key")
}

func TestConfigValidateNamesPaths(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"s3 missing fields", "bucket: {type: s3, s3: {access_key: a, bucket_lookup_type: dns}}", []string{
			"storage.bucket.s3.bucket: required",
			"storage.bucket.s3.endpoint: required",
			"storage.bucket.s3.secret_key_file: access_key and secret_key_file must be set together",
			"storage.bucket.s3.bucket_lookup_type: must be auto, path or virtual-hosted",
		}},
		{"unknown type", "bucket: {type: gcs}", []string{`storage.bucket.type: must be "filesystem" or "s3", got "gcs"`}},
		{"s3 section with filesystem", "bucket: {s3: {bucket: b}}", []string{`storage.bucket.s3: set but type is "filesystem"`}},
		{"bad numbers", "block_duration: 90s\nmax_exemplars: -1", []string{
			"storage.block_duration: must be a whole number of minutes",
			"storage.max_exemplars: must not be negative",
		}},
		{"external labels", "external_labels: {tenant_id: x, 0bad: y, empty: ''}", []string{
			"storage.external_labels.tenant_id: reserved",
			"storage.external_labels.0bad: invalid label name",
			"storage.external_labels.empty: empty value",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := decode(t, tc.yaml)
			err := c.Validate()
			require.Error(t, err)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
			require.Len(t, strings.Split(err.Error(), "\n"), len(tc.want))
		})
	}
}

func TestOpenS3BucketReadsSecretFile(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("s3cr3t\n"), 0o600))
	cfg := storage.Config{Bucket: storage.BucketConfig{Type: storage.BucketS3, S3: storage.S3Config{
		Bucket: "b", Endpoint: "127.0.0.1:1", Insecure: true, AccessKey: "a", SecretKeyFile: secret, BucketLookupType: "path",
	}}}
	db, err := storage.Open(discard, nil, t.TempDir(), cfg)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	cfg.Bucket.S3.SecretKeyFile = filepath.Join(t.TempDir(), "missing")
	_, err = storage.Open(discard, nil, t.TempDir(), cfg)
	require.ErrorContains(t, err, "storage.bucket.s3.secret_key_file")
}
