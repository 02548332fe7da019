package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckConfigExpandsExternalLabels: --check-config expands
// storage.external_labels from the environment, as a start does, and names
// the key and the variable of a reference to an unset one (exit 2).
func TestCheckConfigExpandsExternalLabels(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("storage:\n  external_labels: {replica: '${PHONEHOME_TEST_POD}'}\n"), 0o600))
	args := []string{"--config.file=" + cfg, "--storage.path=" + filepath.Join(dir, "data"), "--insecure.no-auth", "--check-config"}

	t.Setenv("PHONEHOME_TEST_POD", "phonehome-receiver-0")
	var stderr bytes.Buffer
	require.Equal(t, 0, run(args, &stderr), stderr.String())
	require.Contains(t, stderr.String(), "ok")

	require.NoError(t, os.Unsetenv("PHONEHOME_TEST_POD")) // t.Setenv restores it
	stderr.Reset()
	require.Equal(t, 2, run(args, &stderr), stderr.String())
	require.Contains(t, stderr.String(), "storage.external_labels.replica: ${PHONEHOME_TEST_POD}: environment variable PHONEHOME_TEST_POD is not set")
}

// TestCheckConfigPrintsEveryProblemALine: under --check-config a bad
// configuration is plain text, one problem a line with its YAML path and
// line, not a log line (exit 2).
func TestCheckConfigPrintsEveryProblemALine(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("storage:\n  out_of_order_window: 6hours\nlimits:\n  defaults:\n    max_serie_per_cluster: 5\n"), 0o600))
	var stderr bytes.Buffer
	require.Equal(t, 2, run([]string{"--config.file=" + cfg, "--storage.path=" + filepath.Join(dir, "data"), "--insecure.no-auth", "--check-config"}, &stderr))
	require.Equal(t, "receiver: invalid configuration:\n"+
		"parse "+cfg+": storage.out_of_order_window: line 2: want a duration such as 30s, 5m or 1h30m, found a string\n"+
		"limits.defaults.max_serie_per_cluster: line 5: unknown key\n", stderr.String())
}

// TestCheckConfigWarnsOfAllowlistDroppingAlerts: an allowlist pasted from
// CMO's (ALERTS without its alerts form) passes --check-config with a
// warning that names it, as a start does: clusters send alerts, which it
// drops.
func TestCheckConfigWarnsOfAllowlistDroppingAlerts(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "receiver.yaml")
	check := func(allowlist string) string {
		t.Helper()
		require.NoError(t, os.WriteFile(cfg, []byte("allowlist:\n"+allowlist), 0o600))
		var stderr bytes.Buffer
		require.Equal(t, 0, run([]string{"--config.file=" + cfg, "--storage.path=" + filepath.Join(dir, "data"), "--insecure.no-auth", "--check-config"}, &stderr), stderr.String())
		require.Contains(t, stderr.String(), "ok")
		return stderr.String()
	}
	out := check("  - up\n  - '{__name__=\"ALERTS\",alertstate=\"firing\"}'\n")
	require.Contains(t, out, `"level":"WARN"`)
	require.Contains(t, out, "select ALERTS but not alerts")
	require.Contains(t, out, `"in":"allowlist"`)
	require.NotContains(t, check("  - up\n  - '{__name__=~\"ALERTS|alerts\",alertstate=\"firing\"}'\n"), "ALERTS but not alerts")
}
