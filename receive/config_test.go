package receive

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "receiver.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestLoadConfigDefaults(t *testing.T) {
	cfg, err := LoadConfig("")
	require.NoError(t, err)
	require.EqualValues(t, defaultMaxBodyBytes, cfg.Limits.MaxBodyBytes)
	require.EqualValues(t, defaultMaxDecodedBytes, cfg.Limits.MaxDecodedBytes)

	cfg, err = LoadConfig(writeConfig(t, "auth:\n  tokens_file: tokens.yaml\nlimits:\n  max_body_bytes: 1MiB\n"))
	require.NoError(t, err)
	require.True(t, filepath.IsAbs(cfg.Auth.TokensFile), "relative to the config file")
	require.EqualValues(t, 1<<20, cfg.Limits.MaxBodyBytes)

	_, err = LoadConfig(writeConfig(t, ""))
	require.NoError(t, err, "an empty file is all defaults")
}

func TestLoadConfigNamesEveryProblem(t *testing.T) {
	_, err := LoadConfig(writeConfig(t, "auth:\n  tokenz_file: x\n"))
	require.ErrorContains(t, err, "field tokenz_file not found")

	_, err = LoadConfig(writeConfig(t, "limits:\n  max_body_bytes: 64MiB\n  max_decoded_bytes: 1MiB\n  max_label_name_length: -1\n"))
	require.ErrorContains(t, err, "limits.max_decoded_bytes")
	require.ErrorContains(t, err, "limits.max_label_name_length: must not be negative")

	_, err = LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"))
	require.ErrorContains(t, err, "read config")
}
