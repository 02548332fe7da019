package main

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/webtls/webtlstest"
)

func TestTLSFlagsExit2WithEveryProblem(t *testing.T) {
	ca := webtlstest.NewCA(t, "fleet")
	cert, key := ca.Client(t, "cluster")
	salt := writeFile(t, "salt", "0123456789abcdef-salt\n")
	base := []string{"--to=https://127.0.0.1:1", "--from=http://127.0.0.1:2", "--id=abc", "--match=up", "--anonymize-salt-file=" + salt, "--check-config"}
	badWeb := writeFile(t, "web.yml", "tls_server_config:\n  cert_file: /nonexistent-server.pem\n  key_file: /nonexistent-server-key.pem\n")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"certificate without key", []string{"--to-cert-file=" + cert, "--web.config.file=" + badWeb},
			[]string{"--to-cert-file and --to-key-file: give both or neither", "--web.config.file", "nonexistent-server.pem"}},
		{"key without certificate", []string{"--to-key-file=" + key}, []string{"--to-cert-file and --to-key-file: give both or neither"}},
		{"swapped pair", []string{"--to-cert-file=" + key, "--to-key-file=" + cert}, []string{"--to-cert-file/--to-key-file"}},
		{"unknown web config key", []string{"--web.config.file=" + writeFile(t, "web2.yml", "tls_server_config:\n  certfile: x\n")}, []string{"--web.config.file", "certfile"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(append(base, tc.args...), &stderr)
			require.Equal(t, 2, code, stderr.String())
			for _, w := range tc.want {
				require.Contains(t, stderr.String(), w)
			}
		})
	}

	// Both files of a good pair and a good web config pass --check-config.
	srvCert, srvKey := ca.Server(t, "forwarder")
	web := writeFile(t, "web.yml", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n", srvCert, srvKey))
	var stderr bytes.Buffer
	code := run(append(base, "--to-ca-file="+ca.File, "--to-cert-file="+cert, "--to-key-file="+key, "--web.config.file="+web), &stderr)
	require.Equal(t, 0, code, stderr.String())
}

// The forwarder's own listener (/metrics, /healthz) serves TLS under
// --web.config.file, and still logs the address it listens on.
func TestTLSListener(t *testing.T) {
	ca := webtlstest.NewCA(t, "fleet")
	cert, key := ca.Server(t, "forwarder")
	web := writeFile(t, "web.yml", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n", cert, key))
	s := startSelf(t, "--disabled", "--web.config.file="+web)
	defer s.stop(t)

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + s.addr + "/healthz")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))

	code, body := get(t, "http://"+s.addr+"/healthz")
	require.Equal(t, http.StatusBadRequest, code, "plain HTTP to the TLS listener is refused")
	require.NotContains(t, body, "ok")
}
