package buildversion

import (
	"testing"

	"github.com/prometheus/common/version"
	"github.com/stretchr/testify/require"
)

func TestOf(t *testing.T) {
	for in, want := range map[string]string{"": Base, "dev": Base, "v1.4.2": "1.4.2", "1.5.0-rc.1": "1.5.0-rc.1"} {
		require.Equal(t, want, Of(in), in)
	}
}

func TestSet(t *testing.T) {
	old := version.Version
	t.Cleanup(func() { version.Version = old })
	version.Version = ""
	Set()
	require.Equal(t, Base, version.Version)
	require.Contains(t, version.Print("receiver"), "version 0.1.0")
}
