package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/peers"
	"github.com/phonehome/phonehome/receive"
)

// POST /-/reload runs every reload, also after one failed (README: it
// re-reads --config.file, the gathering definitions, the tokens and keys
// files and the rule files), and answers 500
// with the count README shows, never the reason; 200 when all succeeded.
func TestReloadHandlerRunsEveryReload(t *testing.T) {
	var ran []int
	reload := func(i int, err error) func() error {
		return func() error { ran = append(ran, i); return err }
	}
	secret := errors.New("tenants/other/gathering.yaml: line 3")

	rec := httptest.NewRecorder()
	reloadHandler([]func() error{reload(0, secret), reload(1, nil)}).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/-/reload", nil))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Contains(t, rec.Body.String(), "failed to reload: 1 of 2 reloads kept the running version")
	require.NotContains(t, rec.Body.String(), secret.Error())
	require.Equal(t, []int{0, 1}, ran, "the second reload runs after the first failed")

	ran = nil
	rec = httptest.NewRecorder()
	reloadHandler([]func() error{reload(0, nil), reload(1, nil)}).ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/-/reload", nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, []int{0, 1}, ran)
}

// POST /-/reload re-reads every file the receiver applies without a
// restart, and answers 200 once they are in force: with auth.reload_interval
// and rules.reload_interval an hour away, a token removed from the tokens
// file is refused, a key added to the keys file signs and a rule file's
// change is loaded (phonehome_rules_reloads_total) as soon as it answered.
// A broken rule file is a 500.
func TestReloadRereadsTokensKeysAndRules(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "rules"), 0o700))
	tokens := "tokens:\n  - {token: admin, tenant: acme, allow: [admin]}\n  - {token: fleet, tenant: acme, allow: [authorize]}\n"
	write("tokens.yaml", tokens+"  - {token: revoked, tenant: acme, allow: [read]}\n")
	write("k1.pem", ed25519PEM(t))
	write("k2.pem", ed25519PEM(t))
	k1 := "keys:\n  - {kid: k1, created: 2026-01-01T00:00:00Z, private_key_file: k1.pem}\n"
	write("keys.yaml", k1)
	rule := func(expr string) {
		write("rules/r.yaml", "groups:\n- name: g\n  rules:\n  - record: answer\n    expr: "+expr+"\n")
	}
	rule("vector(1)")
	cfg := write("receiver.yaml", `auth:
  tokens_file: tokens.yaml
  keys_file: keys.yaml
  reload_interval: 1h
rules:
  files: [rules/*.yaml]
  reload_interval: 1h
`)
	base := startReceiver(t, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"))
	require.Equal(t, "k1", authorizedKID(t, base))
	code, _, _ := call(t, "GET", base+"/api/v1/status/buildinfo", "revoked")
	require.NotEqual(t, http.StatusUnauthorized, code, "authenticated (200, or 503 before the storage is ready)")

	write("tokens.yaml", tokens)
	write("keys.yaml", k1+"  - {kid: k2, created: 2026-02-01T00:00:00Z, private_key_file: k2.pem}\n")
	rule("vector(2)")
	code, _, body := call(t, "POST", base+"/-/reload", "admin")
	require.Equal(t, http.StatusOK, code, body)
	code, _, _ = call(t, "GET", base+"/api/v1/status/buildinfo", "revoked")
	require.Equal(t, http.StatusUnauthorized, code, "the revoked token is refused once /-/reload answered")
	require.Equal(t, "k2", authorizedKID(t, base), "the added key signs")
	_, _, metrics := call(t, "GET", base+"/metrics", "")
	require.Contains(t, metrics, `phonehome_rules_reloads_total{result="success"} 1`)
	require.Contains(t, metrics, `phonehome_auth_tokens_reloads_total{result="success"} 2`)
	require.Contains(t, metrics, `phonehome_auth_keys_reloads_total{result="success"} 2`)

	rule("vector(")
	code, _, body = call(t, "POST", base+"/-/reload", "admin")
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, body, "failed to reload: 1 of 4 reloads kept the running version")
	_, _, metrics = call(t, "GET", base+"/metrics", "")
	require.Contains(t, metrics, `phonehome_rules_reloads_total{result="failure"} 1`)
}

// SIGHUP does what POST /-/reload does: a token removed from the tokens
// file is refused without waiting for auth.reload_interval.
func TestSIGHUPRereadsTokens(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	tokens := "tokens:\n  - {token: reader, tenant: acme, allow: [read]}\n"
	write("tokens.yaml", tokens+"  - {token: revoked, tenant: acme, allow: [read]}\n")
	cfg := write("receiver.yaml", "auth:\n  tokens_file: tokens.yaml\n  reload_interval: 1h\n")
	base := startReceiver(t, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"))
	code, _, _ := call(t, "GET", base+"/api/v1/status/buildinfo", "revoked")
	require.NotEqual(t, http.StatusUnauthorized, code, "authenticated (200, or 503 before the storage is ready)")

	write("tokens.yaml", tokens)
	require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGHUP))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _, _ := call(t, "GET", base+"/api/v1/status/buildinfo", "revoked"); code == http.StatusUnauthorized {
			break
		}
		require.True(t, time.Now().Before(deadline), "the revoked token is still accepted 10s after SIGHUP")
		runtime.Gosched()
	}
	code, _, _ = call(t, "GET", base+"/api/v1/status/buildinfo", "reader")
	require.NotEqual(t, http.StatusUnauthorized, code)
}

// authorizedKID exchanges the fleet token at /authorize and returns the
// kid of the credential's signing key.
func authorizedKID(t *testing.T, base string) string {
	t.Helper()
	code, _, body := call(t, "POST", base+"/authorize?id=c1", "fleet")
	require.Equal(t, http.StatusOK, code, body)
	var answer struct{ Token string }
	require.NoError(t, json.Unmarshal([]byte(body), &answer))
	hdr, _, _ := strings.Cut(answer.Token, ".")
	raw, err := base64.RawURLEncoding.DecodeString(hdr)
	require.NoError(t, err)
	var h struct{ Kid string }
	require.NoError(t, json.Unmarshal(raw, &h))
	return h.Kid
}

// A replica without peers.endpoints of its own still answers its peers
// with peers.replica_token_file: POST /-/reload re-reads that file there
// too, so a token rotated out of it is refused once the reload answered.
func TestReloadRereadsReplicaTokenWithoutEndpoints(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	write("tokens.yaml", "tokens:\n  - {token: admin, tenant: acme, allow: [admin]}\n")
	write("replica", "old-replica\n")
	cfg := write("receiver.yaml", "auth:\n  tokens_file: tokens.yaml\npeers:\n  replica_token_file: replica\n")
	base := startReceiver(t, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"))
	asPeer := func(token string) int {
		req, err := http.NewRequest(http.MethodGet, base+peers.MetadataPath, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(peers.TenantHeader, "acme")
		req.Header.Set(peers.ScopeHeader, peers.ScopeLocal)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.NotEqual(t, http.StatusUnauthorized, asPeer("old-replica"), "authenticated (200, or 503 before the storage is ready)")

	write("replica", "new-replica\n")
	code, _, body := call(t, "POST", base+"/-/reload", "admin")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, http.StatusUnauthorized, asPeer("old-replica"), "the rotated-out replica token is refused once /-/reload answered")
	require.NotEqual(t, http.StatusUnauthorized, asPeer("new-replica"))
}

// docs/operations.md: the tokens and keys files are re-read every
// auth.reload_interval, 1m when unset (not never).
func TestAuthReloadIntervalDefault(t *testing.T) {
	var cfg receive.AuthConfig
	cfg.SetDefaults()
	require.Equal(t, time.Minute, time.Duration(cfg.ReloadInterval))
}
