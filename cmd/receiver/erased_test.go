package main

import (
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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

// A cluster erased and not re-admitted gets no credential at /authorize:
// 403 with the refusal its writes get (how to re-admit it), so that
// telemeter-client and the forwarder hear why, and no credential of it
// reaches the write path.
func TestAuthorizeRefusesAnErasedCluster(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	write("tokens.yaml", "tokens:\n  - {token: fleet, tenant: acme, allow: [authorize]}\n")
	write("k1.pem", ed25519PEM(t))
	write("keys.yaml", "keys:\n  - {kid: k1, created: 2026-01-01T00:00:00Z, private_key_file: k1.pem}\n")
	cfg := write("receiver.yaml", "auth:\n  tokens_file: tokens.yaml\n  keys_file: keys.yaml\n")
	data := filepath.Join(dir, "data")
	var out strings.Builder
	require.Equal(t, 0, run([]string{"erase", "--storage.path=" + data, "--tenant=acme", "--cluster-id=gone"}, &out), out.String())

	base := startReceiver(t, "--config.file="+cfg, "--storage.path="+data)
	code, _, body := call(t, "POST", base+"/authorize?id=gone", "fleet")
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "cluster was erased")
	require.Contains(t, body, "readmit")
	code, _, body = call(t, "POST", base+"/authorize?id=kept", "fleet")
	require.Equal(t, http.StatusOK, code, body)
}
