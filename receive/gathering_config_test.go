package receive

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGatheringConfigTenants(t *testing.T) {
	p := writeConfig(t, "gathering:\n  file: default.yaml\n  tenants:\n    acme: acme.yaml\n    abs: /etc/abs.yaml\n")
	cfg, err := LoadConfig(p)
	require.NoError(t, err)
	dir := filepath.Dir(p)
	require.True(t, cfg.Gathering.Enabled())
	require.Equal(t, filepath.Join(dir, "default.yaml"), cfg.Gathering.File)
	require.Equal(t, map[string]string{"acme": filepath.Join(dir, "acme.yaml"), "abs": "/etc/abs.yaml"}, cfg.Gathering.Tenants)

	// Every definition file is checked, each named by its YAML path.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "default.yaml"), []byte("version: d1\nselectors: [up]\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "acme.yaml"), []byte("version: a1\nselectors: ['up{']\n"), 0o600))
	err = cfg.Gathering.CheckFiles()
	require.ErrorContains(t, err, `gathering.tenants["acme"]: gathering definition`)
	require.ErrorContains(t, err, `gathering.tenants["abs"]: read gathering definition`)
	require.NotContains(t, err.Error(), "gathering.file")

	cfg, err = LoadConfig(writeConfig(t, "gathering:\n  tenants:\n    acme: acme.yaml\n"))
	require.NoError(t, err)
	require.True(t, cfg.Gathering.Enabled(), "tenants without a default")
	require.Empty(t, cfg.Gathering.Files().Default)

	_, err = LoadConfig(writeConfig(t, "gathering:\n  tenants:\n    '../x': a.yaml\n    ok: ''\n"))
	require.ErrorContains(t, err, `gathering.tenants["../x"]: not a valid tenant name`)
	require.ErrorContains(t, err, `gathering.tenants["ok"]: empty file name`)
	_, err = LoadConfig(writeConfig(t, "gathering:\n  tenants:\n    acme: {file: a.yaml}\n"))
	require.Error(t, err, "strict YAML: a tenant maps to a file name")
}
