package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestScaleOutQueriesWholeBucket runs two receiver replicas (external label
// replica=r0 and r1) that share one real S3 bucket (versitygw), with clusters
// sharded across them and one cluster written to both (overlapping samples,
// as after a load-balancer reshuffle). Both are stopped, so they flush their
// heads and upload the blocks. A third receiver on an empty disk then answers
// fleet queries over all of it: exactly the union of what was written, each
// sample once, per tenant; and it merges its own new head data with the bucket.
func TestScaleOutQueriesWholeBucket(t *testing.T) {
	dir := t.TempDir()
	s3Addr := startVersityGW(t, filepath.Join(dir, "s3"))
	secretFile := filepath.Join(dir, "s3-secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(s3Secret+"\n"), 0o600))
	replicaConfig := func(name string) string {
		rdir := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(rdir, 0o755))
		cfg := writeReceiverConfig(t, rdir, "", fmt.Sprintf(`  external_labels: {replica: %s}
  ship_interval: 1h
  bucket:
    type: s3
    s3:
      bucket: %s
      endpoint: %s
      region: us-east-1
      access_key: %s
      secret_key_file: %s
      insecure: true
      bucket_lookup_type: path
`, name, s3Bucket, s3Addr, s3Access, secretFile))
		f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteString("bucket_store:\n  sync_interval: 1s\n  cache_max_bytes: 64MiB\n")
		require.NoError(t, err)
		require.NoError(t, f.Close())
		return cfg
	}
	r0 := startReceiver(t, replicaConfig("r0"), filepath.Join(dir, "r0", "data"))
	r1 := startReceiver(t, replicaConfig("r1"), filepath.Join(dir, "r1", "data"))

	// 60 samples 30s apart per cluster, ending a few minutes ago.
	now := time.Now()
	base := now.Add(-40 * time.Minute).Truncate(time.Second).UnixMilli()
	const n = 60
	want := map[fleetKey][]string{} // "ts value" pairs as the API renders them
	value := func(cluster string, j int) float64 {
		c, _ := strconv.Atoi(strings.TrimPrefix(cluster, "c"))
		return float64(c*1000+j) + 0.5
	}
	write := func(rcv *Process, tenant, token, cluster string, from, to int) {
		t.Helper()
		ts := prompb.TimeSeries{Labels: labelsOf("__name__", "scaleout_samples", "_id", cluster, "job", "fleet")}
		for j := from; j < to; j++ {
			ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: base + int64(j)*30_000, Value: value(cluster, j)})
		}
		mustWrite(t, rcv.URL(), token, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{ts}})
	}
	expect := func(tenant, cluster string, from, to int) {
		k := fleetKey{tenant, cluster}
		for j := from; j < to; j++ {
			p := fmt.Sprintf("%s %s", formatTime(time.UnixMilli(base+int64(j)*30_000)), strconv.FormatFloat(value(cluster, j), 'f', -1, 64))
			if !slices.Contains(want[k], p) {
				want[k] = append(want[k], p)
			}
		}
	}
	// Sharding: c1, c2 on r0; c3, c4 on r1; c5 on both, overlapping in
	// [20, 40) with identical samples, as replicas hold them.
	for _, c := range []string{"c1", "c2"} {
		write(r0, "acme", tokenAcme, c, 0, n)
		expect("acme", c, 0, n)
	}
	for _, c := range []string{"c3", "c4"} {
		write(r1, "acme", tokenAcme, c, 0, n)
		expect("acme", c, 0, n)
	}
	write(r0, "acme", tokenAcme, "c5", 0, 40)
	write(r1, "acme", tokenAcme, "c5", 20, n)
	expect("acme", "c5", 0, n)
	write(r1, "other", tokenOther, "c9", 0, n)
	expect("other", "c9", 0, n)

	r0.Stop() // SIGINT: flush the heads into blocks, upload them, exit 0
	r1.Stop()

	// The third receiver has never seen any of it.
	r2 := startReceiver(t, replicaConfig("r2"), filepath.Join(dir, "r2", "data"))
	// Its own head data merges with the bucket's blocks.
	write(r2, "acme", tokenAcme, "c6", 0, n)
	expect("acme", "c6", 0, n)

	fleet := func(token string) (map[fleetKey][]string, error) {
		tenant := map[string]string{tokenAcme: "acme", tokenOther: "other"}[token]
		var r queryResult
		code, resp := apiGet(t, r2.URL(), token, "/api/v1/query", url.Values{
			"query": {"scaleout_samples[3h]"}, "time": {formatTime(time.Now())},
		})
		if code != 200 {
			return nil, fmt.Errorf("query: %d %s", code, resp.Error)
		}
		if err := json.Unmarshal(resp.Data, &r); err != nil {
			return nil, err
		}
		got := map[fleetKey][]string{}
		for _, s := range r.Result {
			if len(s.Metric) != 3 || s.Metric["job"] != "fleet" || s.Metric["__name__"] != "scaleout_samples" {
				return nil, fmt.Errorf("unexpected labels %v (external labels must not leak into series)", s.Metric)
			}
			k := fleetKey{tenant, s.Metric["_id"]}
			for _, v := range s.Values {
				got[k] = append(got[k], fmt.Sprintf("%s %s", v[0], v[1]))
			}
		}
		return got, nil
	}
	wantFor := func(tenant string) map[fleetKey][]string {
		out := map[fleetKey][]string{}
		for k, v := range want {
			if k.tenant == tenant {
				out[k] = v
			}
		}
		return out
	}
	for _, tc := range []struct{ tenant, token string }{{"acme", tokenAcme}, {"other", tokenOther}} {
		eventually(t, time.Minute, func() error {
			got, err := fleet(tc.token)
			if err != nil {
				return err
			}
			if w := wantFor(tc.tenant); !reflect.DeepEqual(w, got) {
				return fmt.Errorf("tenant %s: %d series, want %d: %v", tc.tenant, len(got), len(w), got)
			}
			return nil
		})
	}

	// Aggregations over the fleet see each sample once (no double counting
	// of c5's overlap from the two replicas).
	at := time.UnixMilli(base + int64(n-1)*30_000)
	r := instant(t, r2.URL(), tokenAcme, "count_over_time(scaleout_samples[1h])", at)
	require.Len(t, r.Result, 6)
	for _, s := range r.Result {
		require.JSONEq(t, `"60"`, string(s.Value[1]), s.Metric)
	}
	var names []string
	apiData(t, r2.URL(), tokenAcme, "/api/v1/label/_id/values", url.Values{"match[]": {"scaleout_samples"}}, &names)
	require.Equal(t, []string{"c1", "c2", "c3", "c4", "c5", "c6"}, names)

	mfs := scrapeMetrics(t, r2.URL())
	require.GreaterOrEqual(t, metricValue(mfs, "phonehome_bucketstore_downloads_total", map[string]string{"result": "success"}), 3.0)
	require.Equal(t, 0.0, metricValue(mfs, "phonehome_bucketstore_downloads_total", map[string]string{"result": "error"}))
	require.GreaterOrEqual(t, metricValue(mfs, "phonehome_bucketstore_blocks", nil), 3.0)
}

// fleetKey identifies a series of the scale-out test.
type fleetKey struct{ tenant, cluster string }
