package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// A cluster that wrote before a restart, and not since, is still on the
// status page after it (the page's main job: which clusters did not come
// back after an upgrade); one erased while the receiver was down (as after
// a crash between the erasure and the next save) is not.
func TestStatusPageClustersSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--insecure.no-auth", "--storage.path=" + filepath.Join(dir, "data")}
	r := startReceiverProc(t, args...)
	write := func(cluster string) {
		t.Helper()
		body := remoteWriteBody(t, []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: cluster}})
		deadline := time.Now().Add(30 * time.Second)
		for { // 503 until the storage is ready
			resp, err := http.Post(r.base+"/api/v1/write", "application/x-protobuf", bytes.NewReader(body))
			require.NoError(t, err)
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return
			}
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			require.True(t, time.Now().Before(deadline), "the receiver is not ready after 30s")
		}
	}
	write("e")
	write("erased")
	before := statusClusters(t, r.base)
	require.Contains(t, before, "e")
	code, _ := r.stop(t)
	require.Equal(t, 0, code)

	var out bytes.Buffer
	require.Equal(t, 0, run([]string{"erase", "--storage.path=" + filepath.Join(dir, "data"), "--tenant=" + defaultTenant, "--cluster-id=erased"}, &out), out.String())
	saved, err := os.ReadFile(filepath.Join(dir, "data", "status", "clusters.json"))
	require.NoError(t, err)
	require.NotContains(t, string(saved), `"erased"`, "the erasure takes the id out of the saved clusters too")
	require.Contains(t, string(saved), `"e"`)

	r = startReceiverProc(t, args...)
	after := statusClusters(t, r.base)
	require.Contains(t, after, "e", "a cluster that has not written since the restart is still listed")
	require.WithinDuration(t, *before["e"].LastSeen, *after["e"].LastSeen, time.Second, "to the second, as the limiter keeps it")
	require.Equal(t, before["e"].Series, after["e"].Series, "as shown before the restart, though it counts towards no limit")
	require.Equal(t, before["e"].Client, after["e"].Client)
	require.NotContains(t, after, "erased", "an erased cluster does not come back from the file")
	code, _ = r.stop(t)
	require.Equal(t, 0, code)
}

type statusRow struct {
	State    string     `json:"state"`
	LastSeen *time.Time `json:"last_seen"`
	Series   int64      `json:"series"`
	Client   string     `json:"client"`
}

// statusClusters returns the status page's clusters table by _id.
func statusClusters(t *testing.T, base string) map[string]statusRow {
	t.Helper()
	code, _, body := call(t, "GET", base+"/api/v1/status/clusters", "")
	require.Equal(t, http.StatusOK, code, body)
	var resp struct {
		Data struct {
			Clusters []struct {
				ID string `json:"id"`
				statusRow
			} `json:"clusters"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &resp), body)
	out := map[string]statusRow{}
	for _, c := range resp.Data.Clusters {
		out[c.ID] = c.statusRow
	}
	return out
}
