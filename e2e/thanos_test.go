package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// thanosErased is the cluster TestThanosServesCompactsAndErases erases: long
// enough that finding its bytes in the bucket cannot be chance.
const thanosErased = "e2e-thanos-erase-7f3a9c1d"

// TestThanosServesCompactsAndErases holds the README's promise that the
// bucket is in a layout Thanos reads, against a real Thanos
// (scripts/install-thanos.sh): two replicas ship a simulated week of 2h
// blocks to a filesystem bucket, with one cluster on both;
//   - `thanos tools bucket verify` finds no issue;
//   - a Thanos Store Gateway and Querier (deduplicating by `replica`) answer
//     as the receiver does;
//   - the Thanos Compactor compacts them (and downsamples the 2d blocks to
//     5m), and both still answer as before;
//   - `receiver erase` removes one cluster from every block, Thanos' own
//     compacted and downsampled ones included: not one byte of its id is left
//     in the bucket, Thanos answers without it at raw and 5m resolution, and
//     the bucket still verifies.
func TestThanosServesCompactsAndErases(t *testing.T) {
	thanos, err := exec.LookPath("thanos")
	require.NoError(t, err, "the thanos binary is needed: scripts/install-thanos.sh installs it (.ci/run does)")
	dir := t.TempDir()
	bucketDir := mkdir(t, dir, "bucket")
	objstoreFile := filepath.Join(dir, "objstore.yaml")
	require.NoError(t, os.WriteFile(objstoreFile, []byte("type: FILESYSTEM\nconfig:\n  directory: "+bucketDir+"\n"), 0o600))
	config := func(name string, extra string) string {
		return writeReceiverConfig(t, mkdir(t, dir, name), "", fmt.Sprintf(
			"  ship_interval: 1s\n  bucket:\n    type: filesystem\n    filesystem: {directory: %s}\n%s", bucketDir, extra))
	}

	now := time.Now()
	start := now.Add(-7 * 24 * time.Hour).Truncate(time.Hour)
	end := now.Add(-10 * time.Minute)
	for _, rep := range []string{"r0", "r1"} {
		r := startReceiver(t, config(rep, "  external_labels: {replica: "+rep+"}\n"), filepath.Join(dir, rep, "data"))
		clusters := []string{"shared", map[string]string{"r0": "c0", "r1": thanosErased}[rep]}
		var batch []prompb.TimeSeries
		for ts := start; ts.Before(end); ts = ts.Add(5 * time.Minute) {
			for _, c := range clusters {
				batch = append(batch, prompb.TimeSeries{Labels: labelsOf("__name__", "thanos_samples", "_id", c, "job", "fleet"),
					Samples: []prompb.Sample{{Timestamp: ts.UnixMilli(), Value: float64(ts.Unix()%997) / 3}}})
			}
			if len(batch) >= 500 || !ts.Add(5*time.Minute).Before(end) {
				mustWrite(t, r.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: batch})
				batch = nil
			}
		}
		r.Stop() // flush the head into 2h blocks and upload them
	}
	thanosVerify(t, thanos, objstoreFile)

	// The same questions to the receiver and to Thanos. Aggregations leave
	// out the labels only one of them adds (Thanos: the blocks' tenant_id).
	from, to := formatTime(start), formatTime(now)
	questions := map[string]url.Values{
		"range": {"query": {"sum by (_id, job) (thanos_samples)"}, "start": {from}, "end": {to}, "step": {"900"}},
		"count": {"query": {"sum by (_id) (count_over_time(thanos_samples[8d]))"}, "time": {to}},
		"last":  {"query": {"sum by (_id) (thanos_samples)"}, "time": {formatTime(end)}},
	}
	ask := func(base, token string, extra url.Values) map[string]string {
		out := map[string]string{}
		for name, q := range questions {
			params := url.Values{}
			for k, v := range q {
				params[k] = v
			}
			for k, v := range extra {
				params[k] = v
			}
			path := "/api/v1/query"
			if q.Has("step") {
				path = "/api/v1/query_range"
			}
			code, resp := apiGet(t, base, token, path, params)
			if code != http.StatusOK { // the callers poll: a block deleted under a query, say
				out[name] = fmt.Sprintf("HTTP %d: %s", code, resp.Error)
				continue
			}
			var data struct { // without what Thanos adds (its query analysis)
				ResultType string          `json:"resultType"`
				Result     json.RawMessage `json:"result"`
			}
			require.NoError(t, json.Unmarshal(resp.Data, &data))
			out[name] = data.ResultType + " " + string(data.Result)
		}
		return out
	}
	steps := 0
	for ts := start; ts.Before(end); ts = ts.Add(5 * time.Minute) {
		steps++
	}
	queryCfg := config("query", "")
	appendFile(t, queryCfg, "bucket_store:\n  sync_interval: 1s\n  cache_max_bytes: 256MiB\n")
	queryData := filepath.Join(dir, "query", "data")
	r := startReceiver(t, queryCfg, queryData)
	var want map[string]string
	eventually(t, 30*time.Second, func() error {
		want = ask(r.URL(), tokenAcme, nil)
		if strings.Count(want["count"], fmt.Sprintf(`"%d"`, steps)) != 3 {
			return fmt.Errorf("not synced yet: %s", want["count"])
		}
		return nil
	})

	querier := startThanosQuerier(t, thanos, dir, objstoreFile)
	sameAnswers := func(what, base, token string) {
		t.Helper()
		eventually(t, 60*time.Second, func() error {
			got := ask(base, token, nil)
			for k := range want {
				if got[k] != want[k] {
					return fmt.Errorf("%s: %s differs: %s", what, k, firstDiff(got[k], want[k]))
				}
			}
			return nil
		})
	}
	sameAnswers("thanos before compaction", querier.URL(), "")

	shipped := len(bucketMetas(t, bucketDir))
	// The Thanos Compactor, once over the bucket: 2h blocks of each replica
	// into 8h and 2d blocks, the 2d ones downsampled to 5m.
	runThanos(t, thanos, "compact", "--objstore.config-file="+objstoreFile,
		"--data-dir="+filepath.Join(dir, "thanos-compact"), "--consistency-delay=0s", "--delete-delay=0s",
		"--http-address="+freeAddr(t))
	metas := bucketMetas(t, bucketDir)
	var downsampled int
	for _, m := range metas {
		if strings.Contains(readFile(t, m), `"resolution": 300000`) {
			downsampled++
		}
	}
	t.Logf("Thanos' compactor: %d blocks shipped, %d after, %d of them downsampled", shipped, len(metas), downsampled)
	require.Positive(t, downsampled, "the Thanos Compactor downsampled no block")
	require.Less(t, len(metas), shipped/4, "the Thanos Compactor compacted too little")
	thanosVerify(t, thanos, objstoreFile)
	sameAnswers("receiver after Thanos' compaction", r.URL(), tokenAcme)
	sameAnswers("thanos after compaction", querier.URL(), "")
	r.Stop()

	// Erase one cluster offline, from every block Thanos wrote too.
	out, err := exec.Command(filepath.Join(binDir, "receiver"), "erase", "--config.file="+queryCfg, "--storage.path="+queryData,
		"--tenant=acme", "--cluster-id="+thanosErased, "--requested-by=e2e").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), `"state": "done"`)
	t.Logf("receiver erase: %s", out)
	require.Empty(t, grepTree(t, bucketDir, []byte(thanosErased)))
	thanosVerify(t, thanos, objstoreFile)
	for _, res := range []string{"0s", "5m"} {
		eventually(t, 60*time.Second, func() error {
			got := ask(querier.URL(), "", url.Values{"max_source_resolution": {res}})
			if strings.Contains(got["count"], thanosErased) || strings.Contains(got["range"], thanosErased) {
				return fmt.Errorf("resolution %s: the erased cluster is still served: %s", res, got["count"])
			}
			for _, q := range []string{"range", "count"} { // an error answer holds neither
				if !strings.Contains(got[q], `"shared"`) || !strings.Contains(got[q], `"c0"`) {
					return fmt.Errorf("resolution %s: %s: the other clusters are gone: %s", res, q, got[q])
				}
			}
			return nil
		})
	}
}

// runThanos runs a one-shot thanos command and requires it to succeed.
func runThanos(t *testing.T, thanos string, args ...string) string {
	t.Helper()
	out, err := exec.Command(thanos, args...).CombinedOutput()
	require.NoError(t, err, "thanos %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// thanosVerify runs `thanos tools bucket verify` with its default checks and
// requires it to report no issue.
func thanosVerify(t *testing.T, thanos, objstoreFile string) {
	t.Helper()
	out := runThanos(t, thanos, "tools", "bucket", "verify", "--objstore.config-file="+objstoreFile)
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "level=warn") || strings.Contains(line, "level=error") {
			t.Errorf("thanos tools bucket verify: %s", line)
		}
	}
	require.Contains(t, out, "verify task completed")
}

// startThanosQuerier starts a Thanos Store Gateway on the bucket and a
// Querier deduplicating by `replica` in front of it, and returns the
// Querier once both are ready.
func startThanosQuerier(t *testing.T, thanos, dir, objstoreFile string) *Process {
	t.Helper()
	storeGRPC, storeHTTP := freeAddr(t), freeAddr(t)
	store := startThanos(t, thanos, "thanos-store", storeHTTP, "store", "--objstore.config-file="+objstoreFile,
		"--data-dir="+filepath.Join(dir, "thanos-store"), "--sync-block-duration=1s", "--ignore-deletion-marks-delay=0s",
		"--grpc-address="+storeGRPC, "--http-address="+storeHTTP)
	waitHTTP(t, store.URL()+"/-/ready", http.StatusOK)
	queryHTTP := freeAddr(t)
	querier := startThanos(t, thanos, "thanos-query", queryHTTP, "query", "--endpoint="+storeGRPC,
		"--query.replica-label=replica", "--grpc-address="+freeAddr(t), "--http-address="+queryHTTP)
	waitHTTP(t, querier.URL()+"/-/ready", http.StatusOK)
	return querier
}

// startThanos starts a long-running thanos component listening on httpAddr.
func startThanos(t *testing.T, thanos, name, httpAddr string, args ...string) *Process {
	t.Helper()
	return startProcess(t, thanos, name, args, func(line string) (string, bool) {
		return httpAddr, strings.Contains(line, "listening for requests and metrics") && strings.Contains(line, httpAddr)
	})
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	return string(b)
}
