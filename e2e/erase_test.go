package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
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

const (
	tokenAdmin = "adm1n-t0ken"
	// erasedCluster is TestEraseCluster's; erasedClusterPush is its
	// cluster-bound credential, which pushes installer metrics.
	erasedCluster     = "e2e-erase-me-5d1f0a9c3b7e"
	erasedClusterPush = "push-t0ken-of-the-erased"
)

// eraseConfig writes a receiver config on versitygw's bucket with an admin
// token for acme, and returns its path.
func eraseConfig(t *testing.T, dir, s3Addr string) string {
	t.Helper()
	secretFile := filepath.Join(dir, "s3-secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(s3Secret+"\n"), 0o600))
	tokens := fmt.Sprintf("tokens:\n- token: %q\n  tenant: acme\n- token: %q\n  tenant: acme\n  allow: [admin, read]\n- token_sha256: %q\n  tenant: other\n- token: %q\n  tenant: acme\n  cluster_id: %s\n  allow: [push]\n",
		tokenAcme, tokenAdmin, sha256Hex(tokenOther), erasedClusterPush, erasedCluster)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokens), 0o600))
	cfg := fmt.Sprintf(`auth:
  tokens_file: tokens.yaml
storage:
  ship_interval: 1s
  bucket:
    type: s3
    s3: {bucket: %s, endpoint: %s, region: us-east-1, access_key: %s, secret_key_file: %s, insecure: true, bucket_lookup_type: path}
bucket_store:
  sync_interval: 1s
`, s3Bucket, s3Addr, s3Access, secretFile)
	p := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(p, []byte(cfg), 0o600))
	return p
}

// grepTree returns the files under root whose bytes contain needle.
func grepTree(t *testing.T, root string, needle []byte) []string {
	t.Helper()
	var hits []string
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			return nil
		}
		require.NoError(t, err)
		if bytes.Contains(b, needle) {
			hits = append(hits, p)
		}
		return nil
	}))
	return hits
}

func adminPost(t *testing.T, base, token, path string, body any) (int, map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

type eraseJob struct {
	ID            string `json:"id"`
	State         string `json:"state"`
	BlocksDone    int    `json:"blocks_done"`
	BlocksTotal   int    `json:"blocks_total"`
	SeriesRemoved int    `json:"series_removed"`
	ClusterSHA256 string `json:"cluster_sha256"`
}

func eraseStatus(t *testing.T, base, id string) (eraseJob, error) {
	var job eraseJob
	code, resp := apiGet(t, base, tokenAdmin, "/api/v1/admin/erase/"+id, nil)
	if code != http.StatusOK {
		return job, fmt.Errorf("status %d: %s", code, resp.Error)
	}
	return job, json.Unmarshal(resp.Data, &job)
}

// fleetAnswers are the query results of the clusters that stay, as raw
// API bytes, to compare before and after the erasure.
func fleetAnswers(t *testing.T, base string, now time.Time) map[string]string {
	t.Helper()
	out := map[string]string{}
	get := func(name, path string, params url.Values) {
		code, resp := apiGet(t, base, tokenAcme, path, params)
		require.Equal(t, http.StatusOK, code, resp.Error)
		out[name] = string(resp.Data)
	}
	start, end := formatTime(now.Add(-60*time.Hour)), formatTime(now)
	get("range", "/api/v1/query_range", url.Values{"query": {`erase_samples{_id=~"c1|c2"}`}, "start": {start}, "end": {end}, "step": {"60"}})
	get("count", "/api/v1/query", url.Values{"query": {`count_over_time(erase_samples{_id=~"c1|c2"}[3d])`}, "time": {end}})
	get("series", "/api/v1/series", url.Values{"match[]": {`erase_samples{_id=~"c1|c2"}`}, "start": {start}, "end": {end}})
	return out
}

// TestEraseCluster erases one of three clusters of a tenant on versitygw's
// S3: from uploaded blocks (some still local, one in the query cache), a
// local block not yet uploaded, the head and the WAL. Its series are gone
// from every API; the other clusters' answers are byte-identical; not one
// byte of its _id is left in any file of the storage path (TSDB, block cache,
// job state, deny list) or of the bucket's backing directory, nor in the
// receiver's logs; its writes are refused afterwards, until re-admitted;
// the audit event names the job by digest. The receiver is SIGKILLed in the
// middle of the erasure once and resumes it at start.
func TestEraseCluster(t *testing.T) {
	dir := t.TempDir()
	s3Root := filepath.Join(dir, "s3")
	s3Addr := startVersityGW(t, s3Root)
	cfg := eraseConfig(t, dir, s3Addr)
	data := filepath.Join(dir, "data")
	const gone = erasedCluster

	now := time.Now()
	window := now.Truncate(2 * time.Hour)
	series := func(cluster string, at ...time.Time) prompb.TimeSeries {
		ts := prompb.TimeSeries{Labels: labelsOf("__name__", "erase_samples", "_id", cluster, "job", "fleet")}
		for _, a := range at {
			for i := range 4 {
				ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: a.Add(time.Duration(i) * 30 * time.Second).UnixMilli(), Value: float64(len(cluster) + i)})
			}
		}
		return ts
	}
	write := func(r *Process, at ...time.Time) {
		var ss []prompb.TimeSeries
		for _, c := range []string{"c1", "c2", gone} {
			ss = append(ss, series(c, at...))
		}
		mustWrite(t, r.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: ss})
	}
	// Uploaded blocks: two days old (bucket only after the restart's local
	// retention) and 4h old (also still local).
	var procs []*Process
	start := func() *Process {
		p := startReceiver(t, cfg, data)
		procs = append(procs, p)
		return p
	}
	r := start()
	write(r, window.Add(-48*time.Hour+10*time.Minute), window.Add(-4*time.Hour+10*time.Minute))
	mustWrite(t, r.URL(), tokenOther, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{series("c9", window.Add(-48*time.Hour+10*time.Minute))}})
	r.Stop()
	// The head and the WAL, in order and out of order.
	r = start()
	recent := now.Add(-5 * time.Minute)
	write(r, recent)
	write(r, recent.Add(-30*time.Minute))
	eventually(t, 20*time.Second, func() error { // every uploaded block is readable
		got := countSamples(t, r.URL(), tokenAcme, "erase_samples", "3d", now)
		if got[gone] != "16" || got["c1"] != "16" {
			return fmt.Errorf("counts %v", got)
		}
		return nil
	})
	// The cluster's installer pushes: aggregated under its _id, on disk.
	const pushed = "# TYPE cluster_installation_invocation counter\ncluster_installation_invocation{result=\"success\"} 1\n"
	code, msg := pushRaw(t, r.URL(), erasedClusterPush, pushed)
	require.Equal(t, http.StatusOK, code, msg)
	require.NotEmpty(t, grepTree(t, filepath.Join(data, "push"), []byte(gone)))
	before := fleetAnswers(t, r.URL(), now)
	require.NotEmpty(t, grepTree(t, s3Root, []byte(gone)))
	require.NotEmpty(t, grepTree(t, data, []byte(gone)))

	// Only an admin credential of the tenant may erase.
	code, _ = adminPost(t, r.URL(), tokenAcme, "/api/v1/admin/erase", map[string]string{"cluster_id": gone})
	require.Equal(t, http.StatusForbidden, code)
	code, _ = adminPost(t, r.URL(), tokenAdmin, "/api/v1/admin/erase", map[string]string{"tenant": "other", "cluster_id": gone})
	require.Equal(t, http.StatusForbidden, code)
	code, _ = adminPost(t, r.URL(), tokenAdmin, "/api/v1/admin/erase", map[string]string{"selector": "{job=~\".*\"}"})
	require.Equal(t, http.StatusBadRequest, code)

	code, resp := adminPost(t, r.URL(), tokenAdmin, "/api/v1/admin/erase", map[string]string{"cluster_id": gone, "requested_by": "ticket-4711"})
	require.Equal(t, http.StatusAccepted, code, resp)
	id := resp["data"].(map[string]any)["id"].(string)
	// A crash in the middle: the job is on disk and resumes at start.
	r.Kill()
	r = start()
	var job eraseJob
	eventually(t, 60*time.Second, func() error {
		var err error
		if job, err = eraseStatus(t, r.URL(), id); err != nil {
			return err
		}
		if job.State != "done" {
			return fmt.Errorf("job %+v", job)
		}
		return nil
	})
	require.Positive(t, job.BlocksTotal)
	require.Equal(t, job.BlocksTotal, job.BlocksDone)
	require.Positive(t, job.SeriesRemoved)
	require.Equal(t, sha256Hex("acme\x00"+gone), job.ClusterSHA256)

	// Gone from every API; the others answer exactly as before.
	require.Equal(t, map[string]string{"c1": "16", "c2": "16"}, countSamples(t, r.URL(), tokenAcme, "erase_samples", "3d", now))
	var values []string
	apiData(t, r.URL(), tokenAcme, "/api/v1/label/_id/values", url.Values{"start": {formatTime(now.Add(-60 * time.Hour))}, "end": {formatTime(now)}}, &values)
	require.Equal(t, []string{"c1", "c2"}, values)
	require.Equal(t, before, fleetAnswers(t, r.URL(), now))
	require.Equal(t, map[string]string{"c9": "4"}, countSamples(t, r.URL(), tokenOther, "erase_samples", "3d", now))

	// Refused until re-admitted; the other clusters write on.
	body := encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{series(gone, now)}})
	code, msg, err := postWrite(http.DefaultClient, r.URL(), tokenAcme, body, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, code, msg)
	require.Contains(t, msg, "erased")
	code, msg = pushRaw(t, r.URL(), erasedClusterPush, pushed)
	require.Equal(t, http.StatusBadRequest, code, "its pushes too: %s", msg)
	mustWrite(t, r.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{series("c1", now)}})

	mfs := scrapeMetrics(t, r.URL())
	require.Equal(t, 1.0, metricValue(mfs, "phonehome_erasure_jobs_total", map[string]string{"result": "success"}))
	require.Equal(t, float64(job.BlocksTotal), metricValue(mfs, "phonehome_erasure_bucket_blocks_done", nil))
	require.Equal(t, 1.0, metricValue(mfs, "phonehome_storage_denied_clusters", nil))
	require.Equal(t, 4.0, metricValue(mfs, "phonehome_receive_rejected_samples_total", map[string]string{"reason": "erased"}), "refused before the limiter")
	// The erasure flushed the head with writes stopped: always a GC burst.
	require.GreaterOrEqual(t, metricValue(mfs, "phonehome_gc_bursts_total", map[string]string{"outcome": "lowered"}), 1.0)
	var audit bool
	for _, l := range r.Logs() {
		if strings.Contains(l, `"msg":"erasure done"`) && strings.Contains(l, `"audit":true`) &&
			strings.Contains(l, `"requested_by":"ticket-4711"`) && strings.Contains(l, job.ClusterSHA256) {
			audit = true
		}
	}
	require.True(t, audit, "no audit event")
	r.Stop() // flush and upload the rest

	// Not one byte of the _id anywhere: storage path, bucket, logs.
	require.Empty(t, grepTree(t, data, []byte(gone)))
	require.Empty(t, grepTree(t, s3Root, []byte(gone)))
	for _, p := range procs {
		for _, l := range p.Logs() {
			require.NotContains(t, l, gone)
		}
	}

	// Re-admitted, the cluster may write again.
	r = startReceiver(t, cfg, data)
	code, resp = adminPost(t, r.URL(), tokenAdmin, "/api/v1/admin/readmit", map[string]string{"cluster_id": gone})
	require.Equal(t, http.StatusOK, code, resp)
	mustWrite(t, r.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{series(gone, now)}})
	r.Stop()
}

// TestEraseOffline runs `receiver erase` on a stopped receiver's storage
// path with the default filesystem bucket: the cluster is gone from the
// TSDB, the bucket and the block cache, the other stays, and the receiver
// refuses the cluster's writes when it starts again.
func TestEraseOffline(t *testing.T) {
	dir := t.TempDir()
	cfg := writeReceiverConfig(t, dir, "", "  ship_interval: 1s\n")
	appendFile(t, cfg, "bucket_store:\n  sync_interval: 1s\n")
	data := filepath.Join(dir, "data")
	const gone = "e2e-offline-erase-8c2e4f"
	now := time.Now()
	at := now.Truncate(2 * time.Hour).Add(-10*time.Hour + 10*time.Minute) // past the local retention: read from the bucket
	r := startReceiver(t, cfg, data)
	for _, ts := range []time.Time{at, now.Add(-5 * time.Minute)} {
		var ss []prompb.TimeSeries
		for _, c := range []string{"keep", gone} {
			ss = append(ss, prompb.TimeSeries{Labels: labelsOf("__name__", "offline_samples", "_id", c), Samples: []prompb.Sample{{Timestamp: ts.UnixMilli(), Value: 1}}})
		}
		mustWrite(t, r.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: ss})
	}
	r.Stop()
	r = startReceiver(t, cfg, data) // the bucket block lands in the cache
	eventually(t, 20*time.Second, func() error {
		if got := countSamples(t, r.URL(), tokenAcme, "offline_samples", "1d", now); got[gone] != "2" {
			return fmt.Errorf("counts %v", got)
		}
		return nil
	})
	r.Stop()
	require.NotEmpty(t, grepTree(t, filepath.Join(data, "bucket-cache"), []byte(gone)))

	cmd := exec.Command(filepath.Join(binDir, "receiver"), "erase", "--config.file="+cfg, "--storage.path="+data,
		"--tenant=acme", "--cluster-id="+gone, "--requested-by=e2e")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), `"state": "done"`)
	require.NotContains(t, string(out), gone)
	require.Empty(t, grepTree(t, data, []byte(gone)))

	r = startReceiver(t, cfg, data)
	require.Equal(t, map[string]string{"keep": "2"}, countSamples(t, r.URL(), tokenAcme, "offline_samples", "1d", now))
	body := encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Labels: labelsOf("__name__", "offline_samples", "_id", gone), Samples: []prompb.Sample{{Timestamp: now.UnixMilli(), Value: 1}}}}})
	code, msg, err := postWrite(http.DefaultClient, r.URL(), tokenAcme, body, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, code, msg)
	r.Stop()
	require.Empty(t, grepTree(t, data, []byte(gone)))
}

// TestFailedStartShipsNoBlock: a receiver whose start fails before the
// erasure jobs on disk are read (here, a job it cannot decode) flushes its
// head at exit, but ships no block: the job it could not read may be for a
// cluster in that head. Once the job is readable again, the data is all
// there and ships as usual.
func TestFailedStartShipsNoBlock(t *testing.T) {
	dir := t.TempDir()
	cfg := writeReceiverConfig(t, dir, "", "")
	data := filepath.Join(dir, "data")
	now := time.Now()
	r := startReceiver(t, cfg, data)
	mustWrite(t, r.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		{Labels: labelsOf("__name__", "held_samples", "_id", "held"), Samples: []prompb.Sample{{Timestamp: now.Add(-3 * time.Hour).UnixMilli(), Value: 1}}},
		{Labels: labelsOf("__name__", "held_samples", "_id", "held"), Samples: []prompb.Sample{{Timestamp: now.Add(-time.Minute).UnixMilli(), Value: 2}}},
	}})
	r.Kill() // the samples stay in the WAL only

	job := filepath.Join(data, "erasure", "unreadable.json")
	require.NoError(t, os.WriteFile(job, []byte("{"), 0o600))
	out, err := exec.Command(filepath.Join(binDir, "receiver"), "--config.file="+cfg, "--storage.path="+data,
		"--web.listen-address=127.0.0.1:0").CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "decode erasure job unreadable.json", "%s", out)
	require.Empty(t, bucketMetas(t, filepath.Join(data, "bucket")), "a block was shipped while an erasure job was unread")

	// Readable again: everything was kept and ships at the next stop.
	require.NoError(t, os.Remove(job))
	r = startReceiver(t, cfg, data)
	require.Equal(t, map[string]string{"held": "2"}, countSamples(t, r.URL(), tokenAcme, "held_samples", "1d", now))
	r.Stop()
	require.NotEmpty(t, bucketMetas(t, filepath.Join(data, "bucket")))
}

// bucketMetas lists the meta.json files of a filesystem bucket.
func bucketMetas(t *testing.T, root string) []string {
	t.Helper()
	var metas []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == "meta.json" {
			metas = append(metas, p)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	return metas
}
