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
