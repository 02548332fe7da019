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
	r.Reload()
	require.Equal(t, 1, applied)
	require.Zero(t, testutil.ToFloat64(r.restart), "only hot-reloaded sections changed")

	write("limits:\n  defaults:\n    max_series_per_cluster: 200\nstorage:\n  retention: 48h\nallowlist: ['up']\n")
	r.Reload()
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
