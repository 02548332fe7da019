package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"
)

// lifecycleBucket is a bucket for the lifecycle tests: the receiver's
// storage.bucket YAML and a client of the same bucket for the test.
type lifecycleBucket struct {
	yaml string
	bkt  objstore.Bucket
}

// lifecycleBuckets returns the two buckets the lifecycle tests run against:
// the filesystem bucket (the embedded default) and versitygw's S3.
func lifecycleBuckets() map[string]func(t *testing.T, dir string) lifecycleBucket {
	return map[string]func(t *testing.T, dir string) lifecycleBucket{
		"filesystem": func(t *testing.T, dir string) lifecycleBucket {
			bdir := filepath.Join(dir, "bucket")
			require.NoError(t, os.MkdirAll(bdir, 0o755))
			bkt, err := filesystem.NewBucket(bdir)
			require.NoError(t, err)
			return lifecycleBucket{yaml: fmt.Sprintf("  bucket:\n    type: filesystem\n    filesystem: {directory: %s}\n", bdir), bkt: bkt}
		},
		"s3": func(t *testing.T, dir string) lifecycleBucket {
			addr := startVersityGW(t, filepath.Join(dir, "s3"))
			secretFile := filepath.Join(dir, "s3-secret")
			require.NoError(t, os.WriteFile(secretFile, []byte(s3Secret+"\n"), 0o600))
			return lifecycleBucket{yaml: fmt.Sprintf(`  bucket:
    type: s3
    s3: {bucket: %s, endpoint: %s, region: us-east-1, access_key: %s, secret_key_file: %s, insecure: true, bucket_lookup_type: path}
`, s3Bucket, addr, s3Access, secretFile), bkt: openS3(t, addr)}
		},
	}
}

// bucketBlocks lists the block ids in bkt with their tenant (from meta.json,
// "" without one) and whether they carry a deletion mark.
type bucketBlock struct {
	tenant string
	marked bool
	// markTime is the mark's deletion_time (Unix seconds).
	markTime int64
}

func bucketBlocks(t *testing.T, bkt objstore.Bucket) map[ulid.ULID]bucketBlock {
	t.Helper()
	ctx := context.Background()
	out := map[ulid.ULID]bucketBlock{}
	require.NoError(t, bkt.Iter(ctx, "", func(name string) error {
		id, err := ulid.ParseStrict(strings.TrimSuffix(name, "/"))
		if err != nil {
			return nil
		}
		var b bucketBlock
		var meta struct {
			Thanos struct {
				Labels map[string]string `json:"labels"`
			} `json:"thanos"`
		}
		if readBucketJSON(t, bkt, path.Join(id.String(), "meta.json"), &meta) {
			b.tenant = meta.Thanos.Labels["tenant_id"]
		}
		var mark struct {
			DeletionTime int64 `json:"deletion_time"`
		}
		if readBucketJSON(t, bkt, path.Join(id.String(), "deletion-mark.json"), &mark) {
			b.marked, b.markTime = true, mark.DeletionTime
		}
		out[id] = b
		return nil
	}))
	return out
}

func readBucketJSON(t *testing.T, bkt objstore.Bucket, name string, v any) bool {
	t.Helper()
	r, err := bkt.Get(context.Background(), name)
	if bkt.IsObjNotFoundErr(err) {
		return false
	}
	require.NoError(t, err)
	defer r.Close()
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, v), name)
	return true
}

// countSamples returns count_over_time(metric[span]) at ts per _id.
func countSamples(t *testing.T, base, token, metric string, span string, ts time.Time) map[string]string {
	t.Helper()
	var r queryResult
	code, resp := apiGet(t, base, token, "/api/v1/query", url.Values{
		"query": {fmt.Sprintf("count_over_time(%s[%s])", metric, span)}, "time": {formatTime(ts)},
	})
	require.Equal(t, 200, code, resp.Error)
	require.NoError(t, json.Unmarshal(resp.Data, &r))
	out := map[string]string{}
	for _, s := range r.Result {
		var v string
		require.NoError(t, json.Unmarshal(s.Value[1], &v))
		out[s.Metric["_id"]] = v
	}
	return out
}

// TestBucketRetention: blocks past their tenant's storage.bucket_retention
// get a deletion-mark.json, queries stop reading them at once, and they are
// deleted after storage.deletion_delay, not before; a tenant whose retention
// is 0 keeps everything. Against the filesystem bucket and versitygw.
func TestBucketRetention(t *testing.T) {
	for name, newBucket := range lifecycleBuckets() {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			b := newBucket(t, dir)
			now := time.Now()
			// Old samples land in an empty head (any age is in order there),
			// the head is flushed into 2h blocks and uploaded at shutdown.
			// Each group of samples stays inside one 2h block.
			window := now.Truncate(2 * time.Hour)
			old := []time.Time{window.Add(-72*time.Hour + 10*time.Minute), window.Add(-48*time.Hour + 10*time.Minute)}
			recent := now.Add(-10 * time.Minute)
			if recent.Truncate(2*time.Hour) != recent.Add(3*time.Minute).Truncate(2*time.Hour) {
				recent = window.Add(-5 * time.Minute)
			}
			series := func(cluster string, at ...time.Time) prompb.TimeSeries {
				ts := prompb.TimeSeries{Labels: labelsOf("__name__", "retention_samples", "_id", cluster)}
				for _, a := range at {
					for i := range 5 {
						ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: a.Add(time.Duration(i) * 30 * time.Second).UnixMilli(), Value: 1})
					}
				}
				return ts
			}
			first := writeReceiverConfig(t, mkdir(t, dir, "first"), "", "  ship_interval: 1s\n"+b.yaml)
			r := startReceiver(t, first, filepath.Join(dir, "data"))
			mustWrite(t, r.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{series("c1", append(old, recent)...)}})
			mustWrite(t, r.URL(), tokenOther, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{series("c9", append(old, recent)...)}})
			r.Stop()
			before := bucketBlocks(t, b.bkt)
			perTenant := map[string]int{}
			for _, bb := range before {
				perTenant[bb.tenant]++
				require.False(t, bb.marked)
			}
			require.Equal(t, map[string]int{"acme": 3, "other": 3}, perTenant)

			// Retention 24h for acme, 0 (forever) for other; queries read the bucket.
			second := writeReceiverConfig(t, mkdir(t, dir, "second"), "", `  ship_interval: 1s
  bucket_retention: 24h
  tenants:
    other: {bucket_retention: 0s}
  deletion_delay: 4s
  lifecycle_interval: 1s
`+b.yaml)
			appendFile(t, second, "bucket_store:\n  sync_interval: 1s\n")
			r = startReceiver(t, second, filepath.Join(dir, "data2"))
			// The first sync may not have happened yet, but a marked block is
			// never read, so the old samples vanish and stay gone.
			eventually(t, 20*time.Second, func() error {
				if got := countSamples(t, r.URL(), tokenAcme, "retention_samples", "4d", now); got["c1"] != "5" {
					return fmt.Errorf("acme: %v, want only the 5 recent samples", got)
				}
				return nil
			})
			var markedAt time.Time
			for id, bb := range bucketBlocks(t, b.bkt) {
				if bb.tenant == "acme" && bb.marked {
					// The delay is honoured: a marked block is whole until then.
					require.Less(t, time.Since(time.Unix(bb.markTime, 0)), 4*time.Second+time.Second, "block %s", id)
					markedAt = time.Unix(bb.markTime, 0)
				}
			}
			require.False(t, markedAt.IsZero(), "no marked block seen before deletion")
			eventually(t, 30*time.Second, func() error {
				left := map[string]int{}
				for id, bb := range bucketBlocks(t, b.bkt) {
					left[bb.tenant]++
					if bb.tenant == "" {
						return fmt.Errorf("block %s half deleted", id)
					}
				}
				if want := map[string]int{"acme": 1, "other": 3}; fmt.Sprint(left) != fmt.Sprint(want) {
					return fmt.Errorf("blocks per tenant %v, want %v", left, want)
				}
				return nil
			})
			require.GreaterOrEqual(t, time.Since(markedAt), 4*time.Second-time.Second, "deleted before the delay")
			require.Equal(t, map[string]string{"c9": "15"}, countSamples(t, r.URL(), tokenOther, "retention_samples", "4d", now))
			require.Equal(t, map[string]string{"c1": "5"}, countSamples(t, r.URL(), tokenAcme, "retention_samples", "4d", now))

			mfs := scrapeMetrics(t, r.URL())
			require.Equal(t, 2.0, metricValue(mfs, "phonehome_lifecycle_blocks_marked_total", map[string]string{"reason": "retention"}))
			require.Equal(t, 2.0, metricValue(mfs, "phonehome_lifecycle_blocks_deleted_total", nil))
			require.Greater(t, metricValue(mfs, "phonehome_lifecycle_deleted_bytes_total", nil), 0.0)
			require.Zero(t, metricValue(mfs, "phonehome_lifecycle_failures_total", map[string]string{"operation": "delete"}))
			r.Stop()
		})
	}
}

func mkdir(t *testing.T, parts ...string) string {
	t.Helper()
	p := filepath.Join(parts...)
	require.NoError(t, os.MkdirAll(p, 0o755))
	return p
}

func appendFile(t *testing.T, name, s string) {
	t.Helper()
	f, err := os.OpenFile(name, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(s)
	require.NoError(t, errors.Join(err, f.Close()))
}
