package webtls_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/internal/logbuf"
	"github.com/phonehome/phonehome/webtls"
	"github.com/phonehome/phonehome/webtls/webtlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve starts webtls.Serve on a loopback port and returns its address; the
// server is shut down when the test ends, and Serve must then return
// http.ErrServerClosed.
func serve(t *testing.T, webConfig string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			who := "anonymous"
			if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
				who = r.TLS.PeerCertificates[0].Subject.CommonName
			}
			fmt.Fprintf(w, "hello %s, auth=%q", who, r.Header.Get("Authorization"))
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	done := make(chan error, 1)
	go func() { done <- webtls.Serve(ln, srv, webConfig, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		require.ErrorIs(t, <-done, http.ErrServerClosed)
	})
	return ln.Addr().String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// get makes one request on a new connection (so every handshake is fresh).
func get(tlsCfg *tls.Config, url string) (int, string, error) {
	tr := &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer t0ken")
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func TestServePlainWithoutWebConfig(t *testing.T) {
	addr := serve(t, "")
	code, body, err := get(nil, "http://"+addr+"/")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	require.Contains(t, body, "hello anonymous")
}

func TestServeWebConfigWithoutTLSIsPlain(t *testing.T) {
	cfg := writeFile(t, "web.yml", "http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
	require.NoError(t, webtls.ValidateWebConfig(cfg, webtls.ServerOptions{}))
	addr := serve(t, cfg)
	code, _, err := get(nil, "http://"+addr+"/")
	require.NoError(t, err)
	require.Equal(t, 200, code)
}

func TestServeTLS(t *testing.T) {
	ca := webtlstest.NewCA(t, "fleet")
	cert, key := ca.Server(t, "receiver")
	cfg := writeFile(t, "web.yml", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n", cert, key))
	require.NoError(t, webtls.ValidateWebConfig(cfg, webtls.ServerOptions{}))
	addr := serve(t, cfg)

	code, body, err := get(&tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}, "https://"+addr+"/")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	require.Contains(t, body, `auth="Bearer t0ken"`, "the Authorization header reaches the handler")

	// Plain HTTP to the TLS listener is refused: Go's server answers 400
	// and serves nothing.
	code, body, err = get(nil, "http://"+addr+"/")
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, code)
	require.NotContains(t, body, "hello")

	// A client that does not trust the CA refuses the server.
	_, _, err = get(&tls.Config{MinVersion: tls.VersionTLS12}, "https://"+addr+"/")
	var uerr x509.UnknownAuthorityError
	require.ErrorAs(t, err, &uerr)
}

func TestServeMutualTLS(t *testing.T) {
	ca := webtlstest.NewCA(t, "fleet")
	other := webtlstest.NewCA(t, "other")
	cert, key := ca.Server(t, "receiver")
	cfg := writeFile(t, "web.yml", fmt.Sprintf(
		"tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: %s\n  min_version: TLS13\n",
		cert, key, ca.File))
	require.NoError(t, webtls.ValidateWebConfig(cfg, webtls.ServerOptions{}))
	addr := serve(t, cfg)
	url := "https://" + addr + "/"

	good := ca.ClientPair(t, "cluster-a")
	code, body, err := get(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{good}, MinVersion: tls.VersionTLS12}, url)
	require.NoError(t, err)
	require.Equal(t, 200, code)
	require.Contains(t, body, "hello cluster-a")

	// With TLS 1.3 the server checks the client certificate after the
	// handshake, so the refusal shows on the first read: any error will do,
	// as long as nothing is served.
	refused := func(t *testing.T, cfg *tls.Config) {
		t.Helper()
		code, body, err := get(cfg, url)
		require.Error(t, err, "served %d %q", code, body)
	}
	t.Run("no client certificate", func(t *testing.T) {
		refused(t, &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12})
	})
	t.Run("certificate of another CA", func(t *testing.T) {
		wrong := other.ClientPair(t, "intruder")
		refused(t, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{wrong}, MinVersion: tls.VersionTLS12})
	})
	t.Run("below min_version", func(t *testing.T) {
		refused(t, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{good}, MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12})
	})
}

func TestServeReloadsCertificate(t *testing.T) {
	ca := webtlstest.NewCA(t, "fleet")
	cert, key := ca.Server(t, "first")
	cfg := writeFile(t, "web.yml", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n", cert, key))
	addr := serve(t, cfg)

	served := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12})
		require.NoError(t, err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	require.Equal(t, "first", served())
	ca.ServerTo(t, "second", cert, key) // rotated in place, as cert-manager does
	require.Equal(t, "second", served(), "the next connection gets the new certificate, without a restart")
}

func TestValidateWebConfig(t *testing.T) {
	ca := webtlstest.NewCA(t, "fleet")
	cert, key := ca.Server(t, "receiver")
	for _, tc := range []struct {
		name, yaml string
		opts       webtls.ServerOptions
		err        string // "" for valid
	}{
		{name: "tls", yaml: "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n"},
		{name: "mtls, versions, ciphers", yaml: "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: CA\n  min_version: TLS12\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n"},
		{name: "missing cert file", yaml: "tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: KEY\n", err: "nonexistent.pem"},
		{name: "cert without key", yaml: "tls_server_config:\n  cert_file: CERT\n", err: "key"},
		{name: "unknown key", yaml: "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n  certfile: x\n", err: "certfile"},
		{name: "bad client auth type", yaml: "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n  client_auth_type: Sometimes\n", err: "Sometimes"},
		{name: "client CA without client auth", yaml: "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n  client_ca_file: CA\n", err: "Client Auth"},
		{name: "bad min version", yaml: "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n  min_version: TLS99\n", err: "TLS99"},
		{name: "bad cipher", yaml: "tls_server_config:\n  cert_file: CERT\n  key_file: KEY\n  cipher_suites: [TLS_NOPE]\n", err: "TLS_NOPE"},
		{name: "basic auth refused", yaml: "basic_auth_users:\n  alice: $2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi\n", err: "basic_auth_users"},
		{name: "basic auth allowed", yaml: "basic_auth_users:\n  alice: $2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi\n", opts: webtls.ServerOptions{BasicAuth: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := strings.NewReplacer("CERT", cert, "KEY", key, "CA", ca.File).Replace(tc.yaml)
			path := writeFile(t, "web.yml", y)
			err := webtls.ValidateWebConfig(path, tc.opts)
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.err)
			require.ErrorContains(t, err, path, "the error names the file")
		})
	}
	require.NoError(t, webtls.ValidateWebConfig("", webtls.ServerOptions{}), "no file: plain HTTP")
	require.ErrorContains(t, webtls.ValidateWebConfig(filepath.Join(t.TempDir(), "missing.yml"), webtls.ServerOptions{}), "missing.yml")
}

func TestClientConfig(t *testing.T) {
	ca := webtlstest.NewCA(t, "fleet")
	cert, key := ca.Server(t, "receiver")
	clientCert, clientKey := ca.Client(t, "cluster-a")
	web := writeFile(t, "web.yml", fmt.Sprintf(
		"tls_server_config:\n  cert_file: %s\n  key_file: %s\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: %s\n", cert, key, ca.File))
	addr := serve(t, web)

	c := webtls.ClientConfig{CAFile: ca.File, CertFile: clientCert, KeyFile: clientKey}
	require.NoError(t, c.Validate())
	tr, err := c.NewRoundTripper(nil)
	require.NoError(t, err)
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	hello := func() string {
		t.Helper()
		client.CloseIdleConnections() // a new handshake for each
		resp, err := client.Get("https://" + addr + "/")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	require.Contains(t, hello(), "hello cluster-a")

	// A rotated client certificate is presented on the next connection.
	c2, k2 := ca.Client(t, "cluster-a-rotated")
	for _, p := range [][2]string{{c2, clientCert}, {k2, clientKey}} {
		b, err := os.ReadFile(p[0])
		require.NoError(t, err)
		webtlstest.ReplaceFile(t, p[1], b)
	}
	require.Contains(t, hello(), "hello cluster-a-rotated")
	client.CloseIdleConnections()

	// Without the CA the server is not trusted; without a certificate the
	// server refuses.
	client2 := &http.Client{Timeout: 10 * time.Second}
	client2.Transport, err = webtls.ClientConfig{}.NewRoundTripper(nil)
	require.NoError(t, err)
	_, err = client2.Get("https://" + addr + "/")
	require.Error(t, err)
	client2.CloseIdleConnections()
}

// The CA bundle is re-read when it changes, as OpenShift's service CA
// rotates: the bundle gains the new CA, then the server's certificate is
// re-issued by it. A bundle that does not load keeps the last good one.
func TestCAFileRotation(t *testing.T) {
	old, next := webtlstest.NewCA(t, "service-ca-1"), webtlstest.NewCA(t, "service-ca-2")
	cert, key := old.Server(t, "prometheus")
	addr := serve(t, writeFile(t, "web.yml", fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\n", cert, key)))
	bundle := writeFile(t, "service-ca.crt", string(old.PEM()))

	var logs logbuf.Buffer
	rt, err := webtls.ClientConfig{CAFile: bundle}.NewRoundTripper(slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	client := &http.Client{Transport: rt, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	get := func(newConnection bool) error {
		t.Helper()
		if newConnection {
			client.CloseIdleConnections()
		}
		resp, err := client.Get("https://" + addr + "/")
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	require.NoError(t, get(true))

	// The server's certificate is re-issued by a CA the bundle lacks: new
	// connections fail.
	next.ServerTo(t, "prometheus", cert, key)
	require.ErrorContains(t, get(true), "certificate signed by unknown authority")

	// The bundle gains the new CA: trusted from the next request on, and
	// the idle connection verified with the old bundle is closed.
	webtlstest.ReplaceFile(t, bundle, append(old.PEM(), next.PEM()...))
	require.NoError(t, get(false))
	require.NoError(t, get(true))
	require.Contains(t, logs.String(), "CA bundle reloaded")

	// A bundle half written keeps the last good one.
	webtlstest.ReplaceFile(t, bundle, []byte("-----BEGIN CERTIFICATE-----\nMIIB"))
	require.NoError(t, get(true))
	require.NoError(t, get(true))
	require.Equal(t, 1, strings.Count(logs.String(), "CA bundle changed but does not load"), "said once, naming the file: %s", logs.String())
	require.Contains(t, logs.String(), bundle)

	// After a change no connection verified with the bundle before is
	// reused: the next request makes a new one, verified with the new one.
	webtlstest.ReplaceFile(t, bundle, append(old.PEM(), next.PEM()...))
	var reused bool
	trace := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	req, err := http.NewRequestWithContext(trace, http.MethodGet, "https://"+addr+"/", nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	require.False(t, reused, "a new connection, verified with the new bundle")

	// Back to the old CA alone: the new one is no longer trusted.
	webtlstest.ReplaceFile(t, bundle, old.PEM())
	require.ErrorContains(t, get(true), "certificate signed by unknown authority")

	// A bad bundle fails at start.
	_, err = webtls.ClientConfig{CAFile: filepath.Join(t.TempDir(), "missing.crt")}.NewRoundTripper(nil)
	require.ErrorContains(t, err, "missing.crt")
}

func TestClientConfigValidate(t *testing.T) {
	ca := webtlstest.NewCA(t, "fleet")
	cert, key := ca.Client(t, "c")
	notPEM := writeFile(t, "ca.txt", "not a certificate")
	for _, tc := range []struct {
		name string
		c    webtls.ClientConfig
		errs []string
	}{
		{"zero", webtls.ClientConfig{}, nil},
		{"full", webtls.ClientConfig{CAFile: ca.File, CertFile: cert, KeyFile: key, ServerName: "receiver"}, nil},
		{"cert without key", webtls.ClientConfig{CertFile: cert}, []string{"cert_file: needs key_file"}},
		{"key without cert", webtls.ClientConfig{KeyFile: key}, []string{"key_file: needs cert_file"}},
		{"swapped pair", webtls.ClientConfig{CertFile: key, KeyFile: cert}, []string{"cert_file/key_file"}},
		{"every problem named", webtls.ClientConfig{CAFile: notPEM, CertFile: "/nonexistent.pem", KeyFile: key}, []string{"ca_file", "no PEM certificate", "cert_file/key_file", "nonexistent.pem"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if tc.errs == nil {
				require.NoError(t, err)
				cfg, err := tc.c.TLSConfig()
				require.NoError(t, err)
				require.Equal(t, uint16(tls.VersionTLS12), cfg.MinVersion)
				require.Equal(t, tc.c.ServerName, cfg.ServerName)
				return
			}
			for _, e := range tc.errs {
				require.ErrorContains(t, err, e)
			}
		})
	}
	require.False(t, errors.Is(webtls.ClientConfig{}.Validate(), os.ErrNotExist))
}
