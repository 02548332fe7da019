package e2e

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/relabel"
	"github.com/phonehome/phonehome/webtls/webtlstest"
)

// tlsClient is an HTTP client that trusts ca and presents cert (if any),
// on a new connection for every request, so each request sees a fresh
// handshake (and the certificate the server has now).
func tlsClient(ca *webtlstest.CA, cert ...tls.Certificate) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: ca.Pool(), Certificates: cert, MinVersion: tls.VersionTLS12},
	}}
}

// startTLSReceiver starts the receiver with --web.config.file=webConfig and
// waits until /-/ready answers 200 over TLS with client.
func startTLSReceiver(t *testing.T, cfgPath, storagePath, webConfig string, client *http.Client) *Process {
	t.Helper()
	p := startBinary(t, "receiver", "--config.file="+cfgPath, "--storage.path="+storagePath,
		"--web.listen-address=127.0.0.1:0", "--log.format=json", "--web.config.file="+webConfig)
	eventually(t, time.Minute, func() error {
		resp, err := client.Get("https://" + p.Addr + "/-/ready")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("ready: %d", resp.StatusCode)
		}
		return nil
	})
	return p
}

// tlsInstant is instant() over client.
func tlsInstant(t *testing.T, client *http.Client, base, token, q string) (queryResult, error) {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, base+"/api/v1/query?"+url.Values{"query": {q}, "time": {formatTime(time.Now())}}.Encode(), nil)
	require.NoError(t, err)
	r.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(r)
	if err != nil {
		return queryResult{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return queryResult{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return queryResult{}, fmt.Errorf("query %s: %d %s", q, resp.StatusCode, b)
	}
	var env apiResponse
	var out queryResult
	if err := json.Unmarshal(b, &env); err != nil {
		return out, err
	}
	return out, json.Unmarshal(env.Data, &out)
}

// TestTLSReceiver: the receiver serves its one port over TLS with client
// certificates required (mTLS), bearer tokens still apply on top, plain HTTP
// and wrong client certificates are refused, the server certificate is
// rotated without a restart, and both a real forwarder (--to-cert-file) and
// a real Prometheus (remote_write tls_config) deliver over it.
func TestTLSReceiver(t *testing.T) {
	ca := webtlstest.NewCA(t, "fleet")
	other := webtlstest.NewCA(t, "other")
	srvCert, srvKey := ca.Server(t, "receiver-1")
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yml")
	require.NoError(t, os.WriteFile(web, fmt.Appendf(nil,
		"tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: %s\n  min_version: TLS12\n",
		srvCert, srvKey, ca.File), 0o600))

	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	tokens := fmt.Sprintf("tokens:\n- token: %q\n  tenant: acme\n- token: %q\n  tenant: fleet\n  cluster_id: %q\n- token: %q\n  tenant: fleet\n  allow: [read]\n", tokenAcme, fwdToken, hashedID, fwdReadToken)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokens), 0o600))
	cfg := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("auth:\n  tokens_file: tokens.yaml\n"), 0o600))

	clientCert, clientKey := ca.Client(t, "cluster-a")
	pair, err := tls.LoadX509KeyPair(clientCert, clientKey)
	require.NoError(t, err)
	client := tlsClient(ca, pair)
	rcv := startTLSReceiver(t, cfg, filepath.Join(dir, "data"), web, client)
	base := "https://" + rcv.Addr

	now := time.Now()
	write := func(c *http.Client, token, name string) (int, string, error) {
		return postWrite(c, base, token, encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
			Labels: labelsOf("__name__", name), Samples: []prompb.Sample{{Value: 1, Timestamp: now.UnixMilli()}},
		}}}), nil)
	}

	t.Run("client certificate and token", func(t *testing.T) {
		code, body, err := write(client, tokenAcme, "tls_written")
		require.NoError(t, err)
		require.Equal(t, http.StatusNoContent, code, body)
		r, err := tlsInstant(t, client, base, tokenAcme, "tls_written")
		require.NoError(t, err)
		require.Len(t, r.Result, 1)
	})
	t.Run("client certificate without token: bearer authentication still applies", func(t *testing.T) {
		code, _, err := write(client, "", "tls_no_token")
		require.NoError(t, err)
		require.Equal(t, http.StatusUnauthorized, code)
		code, _, err = write(client, "wrong", "tls_no_token")
		require.NoError(t, err)
		require.Equal(t, http.StatusUnauthorized, code)
	})
	t.Run("plain HTTP is refused", func(t *testing.T) {
		code, body, err := postWrite(http.DefaultClient, "http://"+rcv.Addr, tokenAcme, encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
			Labels: labelsOf("__name__", "tls_plain"), Samples: []prompb.Sample{{Value: 1, Timestamp: now.UnixMilli()}},
		}}}), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, code, body)
		require.Contains(t, body, "HTTPS")
	})
	t.Run("no client certificate is refused", func(t *testing.T) {
		_, _, err := write(tlsClient(ca), tokenAcme, "tls_nocert")
		require.Error(t, err)
	})
	t.Run("client certificate of another CA is refused", func(t *testing.T) {
		wrong, err := tls.LoadX509KeyPair(other.Client(t, "intruder"))
		require.NoError(t, err)
		_, _, err = write(tlsClient(ca, wrong), tokenAcme, "tls_wrongcert")
		require.Error(t, err)
	})
	t.Run("server that the client does not trust", func(t *testing.T) {
		_, _, err := write(tlsClient(other, pair), tokenAcme, "tls_untrusted")
		require.Error(t, err)
	})
	// Nothing of the refused requests was stored.
	r, err := tlsInstant(t, client, base, tokenAcme, `{__name__=~"tls_.*"}`)
	require.NoError(t, err)
	require.Len(t, r.Result, 1)
	require.Equal(t, "tls_written", r.Result[0].Metric["__name__"])

	t.Run("certificate rotation without a restart", func(t *testing.T) {
		pid := rcv.cmd.Process.Pid
		served := func() string {
			conn, err := tls.Dial("tcp", rcv.Addr, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
			require.NoError(t, err)
			defer conn.Close()
			return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
		}
		require.Equal(t, "receiver-1", served())
		ca.ServerTo(t, "receiver-2", srvCert, srvKey)
		require.Equal(t, "receiver-2", served())
		code, body, err := write(client, tokenAcme, "tls_after_rotation")
		require.NoError(t, err)
		require.Equal(t, http.StatusNoContent, code, body)
		require.Equal(t, pid, rcv.cmd.Process.Pid)
		select {
		case <-rcv.done:
			t.Fatal("the receiver exited")
		default:
		}
	})

	t.Run("forwarder with --to-cert-file", func(t *testing.T) {
		prom := startFixturePrometheus(t, fixtureExporter(t))
		waitFederated(t, prom.URL())
		fwdCert, fwdKey := ca.Client(t, "forwarder")
		fwd := startBinary(t, "forwarder", forwarderArgs(t, prom.URL(), base, filepath.Join(t.TempDir(), "queue"), "--interval=2s",
			"--to-ca-file="+ca.File, "--to-cert-file="+fwdCert, "--to-key-file="+fwdKey)...)
		waitHTTP(t, "http://"+fwd.Addr+"/readyz", http.StatusOK)
		eventually(t, time.Minute, func() error {
			r, err := tlsInstant(t, client, base, fwdReadToken, fmt.Sprintf(`{_id=%q}`, hashedID))
			if err != nil {
				return err
			}
			if len(r.Result) < 224 {
				return fmt.Errorf("%d of 224 series arrived", len(r.Result))
			}
			return nil
		})
		fwd.Stop()
	})

	t.Run("Prometheus remote-writes over mutual TLS", func(t *testing.T) {
		promCert, promKey := ca.Client(t, "prometheus")
		promAddr := freeAddr(t)
		startPrometheusAt(t, promAddr, fmt.Sprintf(`
global:
  scrape_interval: 1s
  external_labels: {sender: prometheus-tls}
scrape_configs:
- job_name: self
  static_configs: [{targets: [%q]}]
remote_write:
- url: %s/api/v1/write
  authorization: {credentials: %s}
  tls_config: {ca_file: %s, cert_file: %s, key_file: %s}
  queue_config: {min_shards: 1, max_shards: 1, batch_send_deadline: 100ms, min_backoff: 10ms, max_backoff: 200ms}
`, promAddr, base, tokenAcme, ca.File, promCert, promKey))
		eventually(t, time.Minute, func() error {
			r, err := tlsInstant(t, client, base, tokenAcme, `up{job="self",sender="prometheus-tls"}`)
			if err != nil {
				return err
			}
			if len(r.Result) != 1 {
				return fmt.Errorf("%d series of up from Prometheus", len(r.Result))
			}
			return nil
		})
	})
}

// TestTLSReceiverBadWebConfig: a web config the receiver cannot use exits 2
// at start and under --check-config, naming the file and the problem.
func TestTLSReceiverBadWebConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := writeReceiverConfig(t, dir, "", "")
	ca := webtlstest.NewCA(t, "fleet")
	cert, key := ca.Server(t, "receiver")
	for _, tc := range []struct{ name, yaml, want string }{
		{"missing certificate", "tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: " + key + "\n", "nonexistent.pem"},
		{"unknown key", "tls_server_config:\n  cert_file: " + cert + "\n  key_file: " + key + "\n  min_versoin: TLS13\n", "min_versoin"}, //nolint:misspell // a misspelt key, on purpose
		{"basic auth users", "basic_auth_users:\n  alice: $2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi\n", "basic_auth_users"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			web := filepath.Join(t.TempDir(), "web.yml")
			require.NoError(t, os.WriteFile(web, []byte(tc.yaml), 0o600))
			for _, check := range []bool{true, false} {
				args := []string{"--config.file=" + cfg, "--storage.path=" + filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:0", "--web.config.file=" + web}
				if check {
					args = append(args, "--check-config")
				}
				out, err := exec.Command(filepath.Join(binDir, "receiver"), args...).CombinedOutput()
				var ee *exec.ExitError
				require.True(t, errors.As(err, &ee), "exit: %v: %s", err, out)
				require.Equal(t, 2, ee.ExitCode(), string(out))
				require.Contains(t, string(out), web)
				require.Contains(t, string(out), tc.want)
				require.False(t, strings.Contains(string(out), `"listening"`), "it never listened")
			}
		})
	}
	// A good one passes --check-config.
	web := filepath.Join(t.TempDir(), "web.yml")
	require.NoError(t, os.WriteFile(web, fmt.Appendf(nil, "tls_server_config:\n  cert_file: %s\n  key_file: %s\n", cert, key), 0o600))
	out, err := exec.Command(filepath.Join(binDir, "receiver"), "--config.file="+cfg, "--web.config.file="+web, "--check-config").CombinedOutput()
	require.NoError(t, err, string(out))
}
