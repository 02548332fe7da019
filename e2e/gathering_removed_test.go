package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The whole gathering section is removed from the configuration (a
// restart): nothing is served any more (404, as without a definition), but
// the default's last version stays accepted for the grace period, on top
// of allowlist:, across restarts; once the grace period has ended, its
// state is deleted and allowlist: alone applies.
func TestGatheringDefaultRemovedE2E(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "default.yaml"), []byte("version: d1\nselectors: [default_metric]\n"), 0o600))
	const allow = "allowlist: [allowed_metric]\n"
	cfg := writeAuthorizeReceiverConfig(t, dir, allow+"gathering:\n  file: default.yaml\n  reload_interval: 1s\n  grace_period: 10m\n")
	data := filepath.Join(dir, "data")
	stateFile := filepath.Join(data, "gathering", "default.json")
	recv := startReceiver(t, cfg, data)

	post := func(name string) int {
		t.Helper()
		code, cred := authorize(t, recv.URL(), authzFleetToken, "cluster-a")
		require.Equal(t, http.StatusOK, code)
		code, body, err := postWrite(http.DefaultClient, recv.URL(), cred, encodeWrite(t, oneSeries(name, time.Now().UnixMilli())), nil)
		require.NoError(t, err)
		t.Logf("write %s: %d %s", name, code, body)
		return code
	}
	code, body, _ := getGathering(t, recv.URL(), authzReadToken, "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"version":"d1"`)
	require.Equal(t, http.StatusNoContent, post("default_metric"))
	require.Equal(t, http.StatusBadRequest, post("secret_metric"))

	// The section is removed: restart.
	recv.Stop()
	writeAuthorizeReceiverConfig(t, dir, allow)
	recv = startReceiver(t, cfg, data)
	code, body, _ = getGathering(t, recv.URL(), authzReadToken, "")
	require.Equal(t, http.StatusNotFound, code, "no definition served")
	require.Contains(t, body, "no gathering definition")
	require.Equal(t, http.StatusNoContent, post("default_metric"), "d1 within its grace period (6h by default)")
	require.Equal(t, http.StatusNoContent, post("allowed_metric"))
	require.Equal(t, http.StatusBadRequest, post("secret_metric"))
	require.FileExists(t, stateFile)

	// Restart: the same.
	recv.Stop()
	recv = startReceiver(t, cfg, data)
	require.Equal(t, http.StatusNoContent, post("default_metric"), "d1, across the restart")

	// With a grace period of 1s, it has ended: d1 is refused and its
	// state deleted.
	recv.Stop()
	writeAuthorizeReceiverConfig(t, dir, allow+"gathering:\n  reload_interval: 1s\n  grace_period: 1s\n")
	recv = startReceiver(t, cfg, data)
	eventually(t, 30*time.Second, func() error {
		if code := post("default_metric"); code != http.StatusBadRequest {
			return fmt.Errorf("default_metric: %d", code)
		}
		if _, err := os.Stat(stateFile); err == nil {
			return errors.New("state file not deleted")
		}
		return nil
	})
	require.NoFileExists(t, stateFile)
	require.Equal(t, http.StatusNoContent, post("allowed_metric"))
	recv.Stop()
}
