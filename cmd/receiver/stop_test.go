package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// startWithFilesystemBucket starts a receiver without authentication whose
// filesystem bucket is returned, and writes a sample, so that its stop
// flushes a block and uploads it.
func startWithFilesystemBucket(t *testing.T) (r *receiverProc, bucket string) {
	t.Helper()
	dir := t.TempDir()
	bucket = filepath.Join(dir, "bkt")
	cfg := fileWriter(t, dir)("receiver.yaml", "storage:\n  bucket:\n    type: filesystem\n    filesystem: {directory: "+bucket+"}\n")
	r = startReceiverProc(t, "--insecure.no-auth", "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"))
	body, err := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: "c1"}},
		Samples: []prompb.Sample{{Value: 1, Timestamp: time.Now().UnixMilli()}},
	}}}).Marshal()
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for { // 503 until the storage is ready
		resp, err := http.Post(r.base+"/api/v1/write", "application/x-protobuf", bytes.NewReader(snappy.Encode(nil, body)))
		require.NoError(t, err)
		resp.Body.Close()
		if resp.StatusCode == http.StatusNoContent {
			return r, bucket
		}
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.True(t, time.Now().Before(deadline), "the receiver is not ready after 30s")
	}
}

// logLine is a decoded log line: its msg and its other keys.
type logLine map[string]any

func decodeLines(t *testing.T, lines []string) []logLine {
	t.Helper()
	out := make([]logLine, 0, len(lines))
	for _, l := range lines {
		var rec logLine
		require.NoError(t, json.Unmarshal([]byte(l), &rec), l)
		out = append(out, rec)
	}
	return out
}

// A clean stop uploads the head's block, exits 0 and says, last, that no
// block is left behind: what the retire runbook checks.
func TestCleanStopLogsNoBlockPending(t *testing.T) {
	r, bucket := startWithFilesystemBucket(t)
	code, lines := r.stop(t)
	require.Equal(t, 0, code)
	logs := decodeLines(t, lines)
	last := logs[len(logs)-1]
	require.Equal(t, msgStopped, last["msg"], lines[len(lines)-1])
	require.InDelta(t, 0, last["blocks_pending_upload"], 0)
	require.InDelta(t, 0, last["exit_code"], 0)
	metas, err := filepath.Glob(filepath.Join(bucket, "*", "meta.json"))
	require.NoError(t, err)
	require.Len(t, metas, 1, "the head's block is in the bucket")
	for _, l := range logs {
		require.NotEqual(t, "ERROR", l["level"], "%v", l)
	}
}

// A stop whose upload fails exits 1 and names the blocks left on the
// local disk: it used to exit 0, and a volume deleted after such a stop
// lost data never uploaded.
func TestFailedUploadAtStopExitsNonZero(t *testing.T) {
	r, bucket := startWithFilesystemBucket(t)
	require.NoError(t, os.RemoveAll(bucket))
	require.NoError(t, os.WriteFile(bucket, []byte("x\n"), 0o600)) // no longer a directory

	code, lines := r.stop(t)
	require.Equal(t, exitStopFailed, code)
	require.NotEqual(t, 0, code)
	logs := decodeLines(t, lines)
	last := logs[len(logs)-1]
	require.Equal(t, msgStopFailed, last["msg"], lines[len(lines)-1])
	require.Equal(t, "ERROR", last["level"])
	require.InDelta(t, 1, last["blocks_pending_upload"], 0)
	require.InDelta(t, exitStopFailed, last["exit_code"], 0)

	var left []any
	var closeErr string
	for _, l := range logs {
		switch l["msg"] {
		case msgLeftOnDisk:
			left = l["blocks"].([]any)
		case "close storage":
			closeErr = l["err"].(string)
		}
	}
	require.Len(t, left, 1, "the block left behind is named")
	tenant, id, _ := strings.Cut(left[0].(string), "/")
	require.Equal(t, defaultTenant, tenant)
	require.DirExists(t, filepath.Join(filepath.Dir(bucket), "data", "tenants", tenant, id), "still on the local disk")
	require.Contains(t, closeErr, "upload on shutdown")
	require.Equal(t, 1, strings.Count(closeErr, filepath.Join(bucket, id, "meta.json")), "the path is named once: %s", closeErr)
}
