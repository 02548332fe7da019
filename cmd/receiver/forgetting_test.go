package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/status"
)

// An erasure's forget rewrites the status page's saved clusters at once:
// a cluster erased without a deny must not come back from a file saved
// before the erasure if the receiver crashes before its next periodic save.
func TestForgettingSavesTheStatusClustersAtOnce(t *testing.T) {
	l := limits.New(nil, limits.Config{}, nil)
	l.TrackClusters([]string{"series_limit"})
	for _, c := range []string{"kept", "erased"} {
		s := l.Session("acme", c)
		require.NoError(t, s.Admit("up", uint64(len(c))))
		s.Done("prometheus.WriteRequest", "test")
	}
	path := filepath.Join(t.TempDir(), "clusters.json")
	state := status.NewClusterState(slog.New(slog.DiscardHandler), nil, l, path, nil)
	require.NoError(t, state.Save())
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(before), `"erased"`)

	series, known := forgetting{l, state}.Forget("acme", "erased")
	require.True(t, known)
	require.Equal(t, 1, series)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NotContains(t, string(after), `"erased"`)
	require.Contains(t, string(after), `"kept"`)
}
