package peers

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestReplicaTokenRotation: the replica token is rotated file by file, as
// Secrets reach the pods one after another. A file lists the token it
// sends first and every token it accepts: with the old and the new token
// in both orders across the replicas, each reads the other without a
// warning (before, a file held one token: each replica accepted only the
// one it sent, and reads failed between replicas on either side of the
// change until every pod had the new file).
func TestReplicaTokenRotation(t *testing.T) {
	f := newFixture(t)
	set := func(tokens string) *Set {
		path := filepath.Join(t.TempDir(), "replica")
		require.NoError(t, os.WriteFile(path, []byte(tokens), 0o600))
		cfg := f.config()
		cfg.ReplicaTokenFile = path
		return f.set(t, nil, cfg)
	}
	local := tenantDBs{"acme": openDB(t, map[string][]int64{"x": {1000}})}
	sendsNew, sendsOld := set("new-secret\nold-secret\n"), set("old-secret\r\nnew-secret\r\n")
	newSrv, oldSrv := serve(t, sendsNew, local, nil), serve(t, sendsOld, local, nil)
	for name, tc := range map[string]struct {
		reader *Set
		peer   string
	}{
		"sends the new token": {sendsNew, host(oldSrv)},
		"sends the old token": {sendsOld, host(newSrv)},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := f.config(tc.peer)
			cfg.ReplicaTokenFile = tc.reader.cfg.ReplicaTokenFile
			q, err := f.set(t, nil, cfg).NewReader(tenantDBs{}).Querier("acme", 0, 10_000)
			require.NoError(t, err)
			got, ws := readAll(t, q)
			require.Empty(t, ws)
			require.Len(t, got, 1)
		})
	}

	// A token in neither file is not a replica token.
	stranger := set("stranger-secret")
	cfg := f.config(host(newSrv))
	cfg.ReplicaTokenFile = stranger.cfg.ReplicaTokenFile
	q, err := f.set(t, nil, cfg).NewReader(tenantDBs{}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	_, ws := readAll(t, q)
	require.Len(t, ws, 1)
	require.Contains(t, ws[0], "unavailable")
}

// TestReplicaTokenRotationInPlace: docs/operations.md's three steps on
// running replicas, one replica after the other: each re-reads its file at
// a refresh (as every peers.refresh_interval), and no read between them
// fails; once the old token is removed, it is refused.
func TestReplicaTokenRotationInPlace(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	write := func(path, tokens string) {
		require.NoError(t, os.WriteFile(path, []byte(tokens), 0o600))
	}
	withFile := func(cfg Config, path, tokens string) *Set {
		write(path, tokens)
		cfg.ReplicaTokenFile = path
		return f.set(t, nil, cfg)
	}
	read := func(s *Set) []string {
		q, err := s.NewReader(tenantDBs{}).Querier("acme", 0, 10_000)
		require.NoError(t, err)
		got, ws := readAll(t, q)
		if len(ws) == 0 {
			require.Len(t, got, 1)
		}
		return ws
	}
	serverFile, clientFile := filepath.Join(dir, "server"), filepath.Join(dir, "client")
	server := withFile(f.config(), serverFile, "old-secret\n")
	srv := serve(t, server, tenantDBs{"acme": openDB(t, map[string][]int64{"x": {1000}})}, nil)
	client := withFile(f.config(host(srv)), clientFile, "old-secret\n")
	require.Empty(t, read(client))

	for _, step := range []string{"old-secret\nnew-secret\n", "new-secret\nold-secret\n", "new-secret\n"} {
		for _, path := range []string{serverFile, clientFile} {
			write(path, step)
			server.Refresh(context.Background())
			client.Refresh(context.Background())
			require.Empty(t, read(client), "%q in %s", step, filepath.Base(path))
		}
	}
	stale := withFile(f.config(host(srv)), filepath.Join(dir, "stale"), "old-secret\n")
	ws := read(stale)
	require.Len(t, ws, 1)
	require.Contains(t, ws[0], "unavailable")
}

// TestReloadTokens: the receiver's SIGHUP and POST /-/reload re-read the
// token files at once; a file that cannot be read keeps the previous
// tokens and is reported (the reload answers 500).
func TestReloadTokens(t *testing.T) {
	f := newFixture(t)
	path := filepath.Join(t.TempDir(), "replica")
	require.NoError(t, os.WriteFile(path, []byte("old-secret\n"), 0o600))
	cfg := f.config()
	cfg.ReplicaTokenFile = path
	s := f.set(t, nil, cfg)
	sent := func() string {
		tok, replica := s.credential("acme")
		require.True(t, replica)
		return tok
	}
	require.Equal(t, "old-secret", sent())

	require.NoError(t, os.WriteFile(path, []byte("new-secret\nold-secret\n"), 0o600))
	require.NoError(t, s.ReloadTokens())
	require.Equal(t, "new-secret", sent())

	require.NoError(t, os.Remove(path))
	require.ErrorContains(t, s.ReloadTokens(), "peers.replica_token_file")
	require.Equal(t, "new-secret", sent())
	require.Equal(t, 1.0, testutil.ToFloat64(s.m.tokenLoads.WithLabelValues("failure")), "counted, for PhonehomeReceiverPeerTokensReloadFailing")
	require.Equal(t, 1.0, testutil.ToFloat64(s.m.tokenLoads.WithLabelValues("success")))
}

// TestReloadTokensIsAllOrNothing: a reload that cannot read one token file
// keeps every previous token, not the replica token of the new version
// with the tenant tokens of the old one.
func TestReloadTokensIsAllOrNothing(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	replica, tenant := filepath.Join(dir, "replica"), filepath.Join(dir, "acme")
	require.NoError(t, os.WriteFile(replica, []byte("old-secret\n"), 0o600))
	require.NoError(t, os.WriteFile(tenant, []byte("acme-secret\n"), 0o600))
	cfg := f.config()
	cfg.ReplicaTokenFile = replica
	cfg.TenantTokenFiles = map[string]string{"acme": tenant}
	s := f.set(t, nil, cfg)

	require.NoError(t, os.WriteFile(replica, []byte("new-secret\n"), 0o600))
	require.NoError(t, os.Remove(tenant))
	require.ErrorContains(t, s.ReloadTokens(), "peers.tenant_token_files.acme")
	tok, replicaSent := s.credential("other")
	require.True(t, replicaSent)
	require.Equal(t, "old-secret", tok, "the previous replica token stays with the previous tenant tokens")
}
