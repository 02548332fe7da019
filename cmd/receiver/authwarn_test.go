package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/receive"
)

// TestCheckConfigWarnsOfTokensThatCannotDeliver: --check-config (as a
// start) names the tokens that may only authorize while /authorize is off
// (no auth.keys_file), and the unbound writers, push-only tokens not among
// them; by index and name, never by the token.
func TestCheckConfigWarnsOfTokensThatCannotDeliver(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	write("tokens.yaml", `tokens:
  - {token: s3cret-fleet, tenant: fleet, allow: [authorize], name: fleet}
  - {token: s3cret-push, tenant: fleet, allow: [push], name: installer}
  - {token: s3cret-legacy, tenant: fleet, name: legacy}
`)
	check := func(cfg string) string {
		t.Helper()
		var stderr bytes.Buffer
		p := write("receiver.yaml", cfg)
		require.Equal(t, 0, run([]string{"--config.file=" + p, "--storage.path=" + filepath.Join(dir, "data"), "--check-config"}, &stderr), stderr.String())
		require.Contains(t, stderr.String(), "ok")
		require.NotContains(t, stderr.String(), "s3cret", "never the token")
		return stderr.String()
	}

	out := check("auth:\n  tokens_file: tokens.yaml\n")
	lines := strings.Split(out, "\n")
	exchange := lineWith(lines, "POST /authorize is off without auth.keys_file")
	require.Contains(t, exchange, `"level":"WARN"`)
	require.Contains(t, exchange, `tokens[0] (\"fleet\")`)
	require.NotContains(t, exchange, "legacy", "a token that may write delivers without /authorize")
	unbound := lineWith(lines, "tokens may write series for any cluster")
	require.Contains(t, unbound, `tokens[2] (\"legacy\")`)
	require.NotContains(t, unbound, "installer", "a push-only token writes no cluster's series")

	write("keys.yaml", "keys:\n  - {kid: k1, created: 2026-11-01T00:00:00Z, private_key_file: k1.pem}\n")
	write("k1.pem", ed25519PEM(t))
	out = check("auth:\n  tokens_file: tokens.yaml\n  keys_file: keys.yaml\n")
	require.NotContains(t, out, "POST /authorize is off", "with keys_file the fleet token is exchanged")

	// With a webhook the tokens file is never asked about authorize.
	out = check("auth:\n  tokens_file: tokens.yaml\n  keys_file: keys.yaml\n  authorize_webhook: {url: 'http://127.0.0.1:1/authorize'}\n")
	webhook := lineWith(strings.Split(out, "\n"), "auth.authorize_webhook decides every /authorize")
	require.Contains(t, webhook, `tokens[0] (\"fleet\")`)
	require.NotContains(t, out, "POST /authorize is off")
}

// TestShippedExampleConfig: deploy/receiver.yaml with its
// tokens.example.yaml is a working pair: its fleet token can be exchanged
// (keys_file set), and no token writes for any cluster. Its one warning is
// that its signing key is the repository's example, which anyone can sign
// credentials with.
func TestShippedExampleConfig(t *testing.T) {
	var stderr bytes.Buffer
	args := []string{"--config.file=../../deploy/receiver.yaml", "--storage.path=" + filepath.Join(t.TempDir(), "data"), "--check-config"}
	require.Equal(t, 0, run(args, &stderr), stderr.String())
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	require.Len(t, lines, 2, stderr.String())
	require.Contains(t, lines[0], `"level":"WARN"`)
	require.Contains(t, lines[0], "EXAMPLE signing key")
	require.Contains(t, lines[0], `"kids":["example-2026-11"]`)
	require.Equal(t, "ok", lines[1])
}

// lineWith returns the first line that contains s.
func lineWith(lines []string, s string) string {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// ed25519PEM returns a new Ed25519 private key in PKCS#8 PEM.
func ed25519PEM(t *testing.T) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// The example-key warning holds for a key added by a reload as for one
// present at start (FileKeys.OnChange).
func TestReloadWarnsOfExampleKey(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	example, err := os.ReadFile("../../deploy/kubernetes/example-secrets/receiver-keys/ed25519-example.pem")
	require.NoError(t, err)
	write("example.pem", string(example))
	write("own.pem", ed25519PEM(t))
	own := "keys:\n  - {kid: own, created: 2026-01-01T00:00:00Z, private_key_file: own.pem}\n"
	cfg := receive.AuthConfig{
		TokensFile: write("tokens.yaml", "tokens:\n  - {token: fleet, tenant: acme, allow: [authorize]}\n"),
		KeysFile:   write("keys.yaml", own),
	}
	logs, files := startAuth(t, cfg)
	require.NotContains(t, logs.String(), "EXAMPLE signing key")

	write("keys.yaml", own+"  - {kid: example, created: 2026-02-01T00:00:00Z, private_key_file: example.pem}\n")
	for _, f := range files {
		require.NoError(t, f.Reload())
	}
	warning := lineWith(strings.Split(logs.String(), "\n"), "EXAMPLE signing key")
	require.Contains(t, warning, `"kids":["example"]`)
}

// docs/operations.md: while no key's created has passed, the oldest signs
// and the receiver warns, at start and when a reload puts such a file in
// force (a rotation that removed the old key too early).
func TestWarnsWhileNoKeyIsCreated(t *testing.T) {
	const warning = "no key of auth.keys_file has reached its created time"
	dir := t.TempDir()
	write := fileWriter(t, dir)
	write("old.pem", ed25519PEM(t))
	write("new.pem", ed25519PEM(t))
	cfg := receive.AuthConfig{
		TokensFile: write("tokens.yaml", "tokens:\n  - {token: fleet, tenant: acme, allow: [authorize]}\n"),
		KeysFile:   write("keys.yaml", "keys:\n  - {kid: old, created: 2026-01-01T00:00:00Z, private_key_file: old.pem}\n"),
	}
	logs, files := startAuth(t, cfg)
	require.NotContains(t, logs.String(), warning)

	write("keys.yaml", "keys:\n  - {kid: new, created: 2999-01-01T00:00:00Z, private_key_file: new.pem}\n")
	for _, f := range files {
		require.NoError(t, f.Reload())
	}
	require.Contains(t, logs.String(), warning, "at the reload")

	logs, _ = startAuth(t, cfg)
	require.Contains(t, logs.String(), warning, "at start")
}

// startAuth sets cfg's authentication up as the receiver does at start,
// warnings included, and returns its log and the files it re-reads.
func startAuth(t *testing.T, cfg receive.AuthConfig) (*bytes.Buffer, []reloadingFile) {
	t.Helper()
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	a, err := setupAuth(logger, nil, cfg, false)
	require.NoError(t, err)
	warnAuth(logger, a, cfg)
	return &logs, a.reloadingFiles(logger, cfg)
}
