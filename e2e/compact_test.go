package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
)

// liveBlocks counts the bucket's blocks with meta.json and no deletion mark,
// and their bytes.
func liveBlocks(t *testing.T, bkt objstore.Bucket) (n int, bytes int64) {
	t.Helper()
	for id, b := range bucketBlocks(t, bkt) {
		if b.tenant == "" || b.marked {
			continue
		}
		n++
		require.NoError(t, bkt.Iter(context.Background(), id.String(), func(name string) error {
			attrs, err := bkt.Attributes(context.Background(), name)
			if err == nil {
				bytes += attrs.Size
			}
			return nil
		}, objstore.WithRecursiveIter()))
	}
	return n, bytes
}

// TestCompactionOfAWeekFromTwoReplicas: a simulated week of 2h blocks from
// two replicas on versitygw, with one cluster on both (identical samples in
// the overlap). The receiver with compactor.enabled merges them — SIGKILLed
// once right after its first compacted block and restarted — and queries
// (range, instant, count_over_time) answer byte for byte as before, from
// fewer blocks and fewer bytes.
func TestCompactionOfAWeekFromTwoReplicas(t *testing.T) {
	dir := t.TempDir()
	s3Addr := startVersityGW(t, filepath.Join(dir, "s3"))
	bkt := openS3(t, s3Addr)
	secretFile := filepath.Join(dir, "s3-secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(s3Secret+"\n"), 0o600))
	config := func(name, extra string) string {
		return writeReceiverConfig(t, mkdir(t, dir, name), "", fmt.Sprintf(`  ship_interval: 1s
  deletion_delay: 1h
  lifecycle_interval: 1s
  bucket:
    type: s3
    s3: {bucket: %s, endpoint: %s, region: us-east-1, access_key: %s, secret_key_file: %s, insecure: true, bucket_lookup_type: path}
%s`, s3Bucket, s3Addr, s3Access, secretFile, extra))
	}
	now := time.Now()
	start := now.Add(-7 * 24 * time.Hour).Truncate(time.Hour)
	end := now.Add(-10 * time.Minute)
	span := end.Sub(start)
	steps := 0
	for ts := start; ts.Before(end); ts = ts.Add(5 * time.Minute) {
		steps++
	}
	for _, rep := range []string{"r0", "r1"} {
		r := startReceiver(t, config(rep, "  external_labels: {replica: "+rep+"}\n"), filepath.Join(dir, rep, "data"))
		mine := map[string]string{"r0": "c1", "r1": "c2"}[rep]
		var batch []prompb.TimeSeries
		flush := func() {
			if len(batch) > 0 {
				mustWrite(t, r.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: batch})
				batch = nil
			}
		}
		for ts := start; ts.Before(end); ts = ts.Add(5 * time.Minute) {
			frac := float64(ts.Sub(start)) / float64(span)
			clusters := []string{mine}
			if (rep == "r0" && frac < 2.0/3) || (rep == "r1" && frac >= 1.0/3) {
				clusters = append(clusters, "shared")
			}
			for _, c := range clusters {
				batch = append(batch, prompb.TimeSeries{Labels: labelsOf("__name__", "week_samples", "_id", c, "job", "fleet"),
					Samples: []prompb.Sample{{Timestamp: ts.UnixMilli(), Value: float64(ts.Unix()%1009) / 7}}})
			}
			if len(batch) >= 500 {
				flush()
			}
		}
		flush()
		r.Stop() // flush the head into 2h blocks and upload them
	}
	blocksBefore, bytesBefore := liveBlocks(t, bkt)
	require.Greater(t, blocksBefore, 160)

	answers := func(r *Process) map[string]string {
		out := map[string]string{}
		get := func(name, path string, params url.Values) {
			code, resp := apiGet(t, r.URL(), tokenAcme, path, params)
			require.Equal(t, 200, code, resp.Error)
			out[name] = string(resp.Data)
		}
		from, to := formatTime(start), formatTime(now)
		get("range", "/api/v1/query_range", url.Values{"query": {"week_samples"}, "start": {from}, "end": {to}, "step": {"900"}})
		get("rate", "/api/v1/query_range", url.Values{"query": {"sum by (_id) (rate(week_samples[1h]))"}, "start": {from}, "end": {to}, "step": {"3600"}})
		get("count", "/api/v1/query", url.Values{"query": {"count_over_time(week_samples[8d])"}, "time": {to}})
		get("instant", "/api/v1/query", url.Values{"query": {"week_samples"}, "time": {formatTime(end)}})
		return out
	}
	query := config("query", "")
	appendFile(t, query, "bucket_store:\n  sync_interval: 1s\n  cache_max_bytes: 256MiB\n")
	r := startReceiver(t, query, filepath.Join(dir, "query", "data"))
	var before map[string]string
	eventually(t, 30*time.Second, func() error {
		before = answers(r)
		if strings.Count(before["count"], fmt.Sprintf(`"%d"`, steps)) != 3 {
			return fmt.Errorf("not synced yet: %s", before["count"])
		}
		return nil
	})
	r.Stop()

	comp := config("compactor", "compactor:\n  enabled: true\n  wait: 1m\n")
	appendFile(t, comp, "bucket_store:\n  sync_interval: 1s\n  cache_max_bytes: 256MiB\n")
	data := filepath.Join(dir, "compactor", "data")
	c := startReceiver(t, comp, data)
	eventually(t, 60*time.Second, func() error {
		for _, l := range c.Logs() {
			if strings.Contains(l, `"msg":"blocks compacted"`) {
				return nil
			}
		}
		return fmt.Errorf("no compaction yet")
	})
	c.Kill() // in the middle: the sources of the first block may be unmarked
	c = startReceiver(t, comp, data)
	var blocksAfter int
	var bytesAfter int64
	eventually(t, 120*time.Second, func() error {
		n, b := liveBlocks(t, bkt)
		if n == blocksAfter && n < blocksBefore/4 {
			bytesAfter = b
			return nil
		}
		blocksAfter = n
		return fmt.Errorf("%d live blocks", n)
	})
	// Same answers once the bucket store sees the compacted blocks.
	eventually(t, 30*time.Second, func() error {
		got := answers(c)
		for k := range before {
			if got[k] != before[k] {
				return fmt.Errorf("answers to %s differ: %d vs %d bytes: %s", k, len(got[k]), len(before[k]), firstDiff(got[k], before[k]))
			}
		}
		return nil
	})
	require.Equal(t, before, answers(c))
	require.Less(t, bytesAfter, bytesBefore)
	t.Logf("live blocks %d -> %d, bytes %d -> %d", blocksBefore, blocksAfter, bytesBefore, bytesAfter)
	mfs := scrapeMetrics(t, c.URL())
	require.Positive(t, metricValue(mfs, "phonehome_lifecycle_compactions_total", nil))
	require.Zero(t, metricValue(mfs, "phonehome_lifecycle_failures_total", map[string]string{"operation": "compact"}))
}

// firstDiff shows where two strings start to differ.
func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-200)
	return fmt.Sprintf("got …%s… want …%s…", a[lo:min(len(a), i+100)], b[lo:min(len(b), i+100)])
}
