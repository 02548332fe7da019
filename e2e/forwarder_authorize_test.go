package e2e

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/relabel"
)

const (
	authzFleetToken = "fleet-authorize-only"
	authzReadToken  = "fleet-read"
)

// writeSigningKey writes a fresh Ed25519 key as dir/<kid>.pem and a keys
// file naming only it.
func writeSigningKey(t *testing.T, dir, kid string) {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, kid+".pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "keys.yaml"),
		fmt.Appendf(nil, "keys:\n- kid: %s\n  created: 2026-01-01T00:00:00Z\n  private_key_file: %s.pem\n", kid, kid), 0o600))
}

// writeAuthorizeReceiverConfig writes a receiver config with /authorize
// enabled (shortest credential lifetime, 1m): the fleet token may only be
// exchanged, the read token only query. extra is appended to the config.
func writeAuthorizeReceiverConfig(t *testing.T, dir, extra string) string {
	t.Helper()
	writeSigningKey(t, dir, "k1")
	tokens := fmt.Sprintf("tokens:\n- {token: %q, tenant: fleet, allow: [authorize]}\n- {token: %q, tenant: fleet, allow: [read]}\n",
		authzFleetToken, authzReadToken)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokens), 0o600))
	p := filepath.Join(dir, "receiver.yaml")
	cfg := "auth:\n  tokens_file: tokens.yaml\n  keys_file: keys.yaml\n  credential_ttl: 1m\n" + extra
	require.NoError(t, os.WriteFile(p, []byte(cfg), 0o600))
	return p
}

// authorizeForwarderArgs is forwarderArgs with the fleet token and a
// forwarder config whose credential renewal happens at 40–50% of the lifetime.
func authorizeForwarderArgs(t *testing.T, prom, to, queueDir string, extraConfig string, extra ...string) []string {
	t.Helper()
	args := forwarderArgs(t, prom, to, queueDir, extra...)
	dir := t.TempDir()
	tok := filepath.Join(dir, "fleet-token")
	require.NoError(t, os.WriteFile(tok, []byte(authzFleetToken+"\n"), 0o600))
	cfg := filepath.Join(dir, "forwarder.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("send:\n  min_backoff: 100ms\n  max_backoff: 500ms\n  flush_timeout: 2s\n"+
		"authorize:\n  renew_at: 0.5\n  jitter: 0.1\n  min_backoff: 100ms\n  max_backoff: 1s\n"+extraConfig), 0o600))
	// Later flags win: the fleet token and this config replace forwarderArgs'.
	return append(args, "--to-token-file="+tok, "--config.file="+cfg, "--authorize=always")
}

// The forwarder exchanges its fleet token for a cluster credential bound to
// its hashed id, writes with it, renews it before it expires, and
// re-authorizes once when the receiver rejects it (here: the receiver
// restarts with a rotated signing key, so the old credential is invalid).
func TestForwarderAuthorizeE2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	prom := startFixturePrometheus(t, fixtureExporter(t))
	waitFederated(t, prom.URL())

	dir := t.TempDir()
	cfg := writeAuthorizeReceiverConfig(t, dir, "")
	addr := freeAddr(t)
	recv := startReceiver(t, cfg, filepath.Join(dir, "data"), "--web.listen-address="+addr)
	proxy := newRecordingProxy(t, recv.URL())
	fwd := startBinary(t, "forwarder", authorizeForwarderArgs(t, prom.URL(), proxy.srv.URL, filepath.Join(dir, "queue"), "", "--interval=1s")...)

	// The series arrive, bound to the hashed id by the credential.
	eventually(t, time.Minute, func() error {
		r := instant(t, recv.URL(), authzReadToken, fmt.Sprintf(`count({_id=%q})`, hashedID), time.Now())
		if len(r.Result) == 0 {
			return fmt.Errorf("no series yet")
		}
		return nil
	})
	all := instant(t, recv.URL(), authzReadToken, `{__name__=~".+"}`, time.Now())
	require.Len(t, all.Result, 224)
	for _, s := range all.Result {
		require.Equal(t, hashedID, s.Metric["_id"])
	}
	require.Positive(t, metricsValue(t, recv.URL(), "phonehome_auth_authorize_requests_total", map[string]string{"result": "issued"}))

	// Renewal: the 1m credential is renewed after 24–30s, before it expires,
	// and writes never fail for credentials meanwhile.
	eventually(t, 50*time.Second, func() error {
		if v := metricsValue(t, fwd.URL(), "phonehome_forward_authorize_requests_total", map[string]string{"result": "success"}); v < 2 {
			return fmt.Errorf("%v exchanges", v)
		}
		return nil
	})
	require.LessOrEqual(t, metricsValue(t, fwd.URL(), "phonehome_forward_send_requests_total", map[string]string{"code": "401"}), 0.0, "no write refused (-1: never seen)")
	require.Zero(t, metricsValue(t, fwd.URL(), "phonehome_forward_credential_rejections_total", nil))

	// The receiver restarts with a new signing key: the forwarder's
	// credential (renewed ≥24s from now) is refused, it re-authorizes once
	// and the same batch goes through.
	recv.Stop()
	writeSigningKey(t, dir, "k2")
	recv = startReceiver(t, cfg, filepath.Join(dir, "data"), "--web.listen-address="+addr)
	eventually(t, time.Minute, func() error {
		if v := metricsValue(t, fwd.URL(), "phonehome_forward_credential_rejections_total", nil); v < 1 {
			return fmt.Errorf("%v rejections", v)
		}
		return nil
	})
	sentAtRejection := metricsValue(t, fwd.URL(), "phonehome_forward_sent_samples_total", nil)
	eventually(t, time.Minute, func() error {
		mfs := scrapeMetrics(t, fwd.URL())
		sent := metricValue(mfs, "phonehome_forward_sent_samples_total", nil)
		if records := metricValue(mfs, "phonehome_forward_queue_records", nil); sent <= sentAtRejection || records != 0 {
			return fmt.Errorf("sent %v (was %v), %v records queued", sent, sentAtRejection, records)
		}
		return nil
	})
	require.Positive(t, metricsValue(t, recv.URL(), "phonehome_auth_authorize_requests_total", map[string]string{"result": "issued"}))
	mfs := scrapeMetrics(t, fwd.URL())
	require.Zero(t, metricValue(mfs, "phonehome_forward_dropped_samples_total", map[string]string{"reason": "http_4xx"}), "nothing lost to the rejection")
	fwd.Stop()

	// Only the hashed id ever left: in /authorize forms and in writes.
	proxy.mu.Lock()
	defer proxy.mu.Unlock()
	forms := 0
	for _, b := range proxy.bodies {
		require.False(t, bytes.Contains(b, []byte(fwdClusterID)), "raw id on the wire")
		if bytes.Equal(b, []byte(url.Values{"id": {hashedID}}.Encode())) {
			forms++
		}
	}
	require.GreaterOrEqual(t, forms, 2, "exchange at start and renewals, with the hashed id")
}
