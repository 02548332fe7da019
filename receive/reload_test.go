package receive

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestConfigReloadNamesWhatNeedsARestart: a reload applies limits, the
// allowlist and elision; a change to any other section is reported (log,
// phonehome_receive_config_restart_required) instead of passing as applied.
func TestConfigReloadNamesWhatNeedsARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "receiver.yaml")
	write := func(s string) { require.NoError(t, os.WriteFile(path, []byte(s), 0o600)) }
	write("limits:\n  defaults:\n    max_series_per_cluster: 100\nstorage:\n  retention: 24h\n")
	applied := 0
	r := NewConfigReloader(discard(), prometheus.NewRegistry(), path, func(*Config) { applied++ })

	write("limits:\n  defaults:\n    max_series_per_cluster: 200\nstorage:\n  retention: 24h\nallowlist: ['up']\n")
	require.NoError(t, r.Reload())
	require.Equal(t, 1, applied)
	require.Zero(t, testutil.ToFloat64(r.restart), "only hot-reloaded sections changed")

	write("limits:\n  defaults:\n    max_series_per_cluster: 200\nstorage:\n  retention: 48h\nallowlist: ['up']\n")
	require.NoError(t, r.Reload())
	require.Equal(t, 2, applied, "what can be applied still is")
	require.Equal(t, 1.0, testutil.ToFloat64(r.restart))
	running, err := LoadConfig(path)
	require.NoError(t, err)
	require.Equal(t, []string{"storage"}, restartSections(r.started, running))
}

// TestConfigLoadedTwiceIsEqual: the comparison sees no change between two
// loads of one file (the deployment example, which sets every section).
func TestConfigLoadedTwiceIsEqual(t *testing.T) {
	a, err := LoadConfig("../deploy/receiver.yaml")
	require.NoError(t, err)
	b, err := LoadConfig("../deploy/receiver.yaml")
	require.NoError(t, err)
	require.Empty(t, restartSections(a, b))
}

// TestConfigReloadExpandsExternalLabels: a reload expands
// storage.external_labels again: the running configuration is not seen as
// changed by the expansion, a new value is picked up (as a restart-only
// change), and a reference to an unset variable fails the reload and keeps
// the previous configuration.
func TestConfigReloadExpandsExternalLabels(t *testing.T) {
	t.Setenv("PHONEHOME_TEST_POD", "r0")
	path := filepath.Join(t.TempDir(), "receiver.yaml")
	write := func(s string) { require.NoError(t, os.WriteFile(path, []byte(s), 0o600)) }
	write("limits:\n  defaults:\n    max_series_per_cluster: 100\nstorage:\n  external_labels: {replica: '${PHONEHOME_TEST_POD}'}\n")
	var applied []*Config
	r := NewConfigReloader(discard(), prometheus.NewRegistry(), path, func(c *Config) { applied = append(applied, c) })
	require.Equal(t, "r0", r.started.Storage.ExternalLabels["replica"])

	write("limits:\n  defaults:\n    max_series_per_cluster: 200\nstorage:\n  external_labels: {replica: '${PHONEHOME_TEST_POD}'}\n")
	require.NoError(t, r.Reload())
	require.Len(t, applied, 1)
	require.Equal(t, "r0", applied[0].Storage.ExternalLabels["replica"])
	require.Zero(t, testutil.ToFloat64(r.restart), "only limits changed")

	t.Setenv("PHONEHOME_TEST_POD", "r1")
	write("limits:\n  defaults:\n    max_series_per_cluster: 300\nstorage:\n  external_labels: {replica: '${PHONEHOME_TEST_POD}'}\n")
	require.NoError(t, r.Reload())
	require.Len(t, applied, 2)
	require.Equal(t, "r1", applied[1].Storage.ExternalLabels["replica"])
	require.Equal(t, 1.0, testutil.ToFloat64(r.restart), "the replica label changed: a restart applies it")

	write("limits:\n  defaults:\n    max_series_per_cluster: 400\nstorage:\n  external_labels: {replica: '${PHONEHOME_TEST_UNSET}'}\n")
	require.ErrorContains(t, r.Reload(), "PHONEHOME_TEST_UNSET")
	require.Len(t, applied, 2, "an invalid version is not applied")
	require.Equal(t, 1.0, testutil.ToFloat64(r.reloads.WithLabelValues("failure")))
}
