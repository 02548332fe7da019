package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/peers"
)

// startReceiver runs the receiver in this process with args, on loopback,
// and returns its base URL. At cleanup it stops it and requires exit code 0.
func startReceiver(t *testing.T, args ...string) string {
	t.Helper()
	r := startReceiverProc(t, args...)
	t.Cleanup(func() {
		code, _ := r.stop(t)
		require.Equal(t, 0, code)
	})
	return r.base
}

// receiverProc is a receiver run in this process by startReceiverProc.
type receiverProc struct {
	base   string
	code   chan int
	logged chan struct{} // closed once the log is read to its end
	lines  []string      // every log line; read after logged is closed

	stopOnce sync.Once
	exit     int
}

// startReceiverProc runs the receiver in this process with args, on
// loopback, once it logs its listen address. Its stop method stops it; if
// the test has not, cleanup does.
func startReceiverProc(t *testing.T, args ...string) *receiverProc {
	t.Helper()
	pr, pw := io.Pipe()
	r := &receiverProc{code: make(chan int, 1), logged: make(chan struct{})}
	go func() {
		r.code <- run(append([]string{"--web.listen-address=127.0.0.1:0"}, args...), pw)
		pw.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		defer close(r.logged)
		sc := bufio.NewScanner(pr)
		sc.Buffer(nil, 1<<20) // a line naming every block left behind is long
		for sc.Scan() {
			r.lines = append(r.lines, sc.Text())
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" {
				addr <- rec.Addr
			}
		}
	}()
	select {
	case a := <-addr:
		r.base = "http://" + a
		t.Cleanup(func() { r.stop(t) })
		return r
	case c := <-r.code:
		t.Fatalf("the receiver exited with %d before listening", c)
		return nil
	case <-time.After(30 * time.Second):
		t.Fatal("the receiver did not log a listen address")
		return nil
	}
}

// stop sends this process SIGTERM, which the receiver's shutdown
// subscription takes, and returns its exit code and every line it logged.
func (r *receiverProc) stop(t *testing.T) (code int, lines []string) {
	t.Helper()
	r.stopOnce.Do(func() {
		require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGTERM))
		select {
		case r.exit = <-r.code:
		case <-time.After(30 * time.Second):
			r.exit = -1
			t.Error("the receiver did not stop")
		}
		<-r.logged
	})
	return r.exit, r.lines
}

// call sends method url with token (none if empty) and returns the answer.
func call(t *testing.T, method, url, token string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(""))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// The receiver as started: every write-only or admin endpoint asked with a
// wrong method is 405 with Allow, whatever the credential (none included),
// and POST /-/reload reloads the configuration for an admin: 200, or 500
// with why the running one was kept.
func TestServedRoutes(t *testing.T) {
	write := fileWriter(t, t.TempDir())
	tokens := write("tokens.yaml", `tokens:
  - {token: writer, tenant: acme, allow: [write]}
  - {token: reader, tenant: acme, allow: [read]}
  - {token: admin, tenant: acme, allow: [admin]}
`)
	write("k1.pem", ed25519PEM(t))
	keys := write("keys.yaml", "keys:\n  - {kid: k1, created: 2026-11-01T00:00:00Z, private_key_file: k1.pem}\n") // /authorize served
	authCfg := "auth:\n  tokens_file: " + tokens + "\n  keys_file: " + keys + "\n"
	cfgFile := write("receiver.yaml", authCfg)
	base := startReceiver(t, "--config.file="+cfgFile, "--storage.path="+filepath.Join(filepath.Dir(cfgFile), "data"))

	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/api/v1/write", "POST"},
		{"GET", "/upload", "POST"},
		{"GET", "/metrics/v1/receive", "POST"},
		{"GET", "/metrics/job/installer", "POST, PUT"},
		{"GET", "/api/v1/read", "POST"},
		{"GET", "/authorize", "POST"},
		{"GET", "/api/v1/admin/readmit", "POST"},
		{"PUT", "/api/v1/admin/erase", "GET, HEAD, POST"},
		{"GET", "/-/reload", "POST, PUT"},
	} {
		for _, token := range []string{"writer", "reader", "admin", ""} {
			code, hdr, body := call(t, tc.method, base+tc.path, token)
			require.Equal(t, http.StatusMethodNotAllowed, code, "%s %s as %q: %s", tc.method, tc.path, token, body)
			require.Equal(t, tc.allow, hdr.Get("Allow"), "%s %s", tc.method, tc.path)
		}
	}
	code, _, _ := call(t, "GET", base+"/unknown", "reader")
	require.Equal(t, http.StatusNotFound, code)
	code, _, _ = call(t, "GET", base+"/api/v1/unknown", "writer")
	require.Equal(t, http.StatusForbidden, code, "the query API's paths stay behind its authentication")

	// /-/reload: the admin permission.
	code, _, _ = call(t, "POST", base+"/-/reload", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = call(t, "POST", base+"/-/reload", "writer")
	require.Equal(t, http.StatusForbidden, code)
	require.NoError(t, os.WriteFile(cfgFile, []byte(authCfg+"allowlist: ['up']\n"), 0o600))
	code, _, body := call(t, "POST", base+"/-/reload", "admin")
	require.Equal(t, http.StatusOK, code, body)
	_, _, metrics := call(t, "GET", base+"/metrics", "")
	require.Contains(t, metrics, `phonehome_receive_config_reloads_total{result="success"} 1`)
	require.NoError(t, os.WriteFile(cfgFile, []byte(authCfg+"allowlist: ['up{']\n"), 0o600))
	code, _, body = call(t, "PUT", base+"/-/reload", "admin")
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, body, "failed to reload: 1 of ")
	require.NotContains(t, body, "allowlist[0]", "why is in the log: an admin is one tenant's, the reasons may be others'")
}

// With peers, /-/ready (and telemeter-server's /healthz/ready) carries the
// replica's instance header, so that a replica listing itself among its
// peers recognises itself at its first health check of them, instead of
// probing itself as a peer until a query's answer tells it.
func TestReadyCarriesTheInstanceHeader(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	cfg := write("receiver.yaml", "peers:\n  endpoints: [127.0.0.1:1]\n")
	base := startReceiver(t, "--insecure.no-auth", "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"))
	for _, path := range []string{"/-/ready", "/healthz/ready"} {
		_, hdr, _ := call(t, "GET", base+path, "")
		require.NotEmpty(t, hdr.Get(peers.InstanceHeader), path)
	}
}
