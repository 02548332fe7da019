package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/relabel"
	"github.com/phonehome/phonehome/webtls/webtlstest"
)

// startTLSFixturePrometheus starts a real Prometheus at addr that scrapes
// the fixture exporter and serves HTTPS with the certificate in webConfig,
// and waits until client sees the fixture federated.
func startTLSFixturePrometheus(t *testing.T, addr, exporterHost, webConfig string, client *http.Client) *Process {
	t.Helper()
	p := launchPrometheusAt(t, addr, fixtureScrapeConfig(exporterHost), "--web.config.file="+webConfig)
	waitFederatedWith(t, client, "https://"+addr)
	return p
}

// TestForwarderFollowsServiceCARotation: OpenShift's service CA rotates
// under a running forwarder, as cluster-monitoring-operator deploys
// telemeter-client: the CA bundle (--from-ca-file) gains the new CA, CMO's
// reload sidecar POSTs /-/reload (no extra flag), Prometheus' serving
// certificate is re-issued by the new CA and Prometheus restarts. The
// forwarder keeps federating, without a restart.
func TestForwarderFollowsServiceCARotation(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	dir := t.TempDir()
	oldCA, newCA := webtlstest.NewCA(t, "service-ca-1"), webtlstest.NewCA(t, "service-ca-2")
	bundle := filepath.Join(dir, "service-ca.crt")
	require.NoError(t, os.WriteFile(bundle, oldCA.PEM(), 0o600))
	cert, key := oldCA.Server(t, "prometheus-k8s")
	web := filepath.Join(dir, "web.yml")
	require.NoError(t, os.WriteFile(web, fmt.Appendf(nil, "tls_server_config:\n  cert_file: %s\n  key_file: %s\n", cert, key), 0o600))

	exporter := fixtureExporter(t)
	exporterHost := exporter.Listener.Addr().String()
	promAddr := freeAddr(t)
	prom := startTLSFixturePrometheus(t, promAddr, exporterHost, web, tlsClient(oldCA))

	recv := startReceiver(t, writeForwarderReceiverConfig(t, dir, hashedID), filepath.Join(dir, "data"))
	fwd := startBinary(t, "forwarder", forwarderArgs(t, "https://"+promAddr, recv.URL(), filepath.Join(dir, "queue"),
		"--interval=2s", "--from-ca-file="+bundle)...)
	fwdURL := "http://" + fwd.Addr
	pid := fwd.cmd.Process.Pid
	q := fmt.Sprintf(`cluster_version{_id=%q}`, hashedID)
	waitFresh(t, recv.URL(), q, 4, time.Now())

	// The service CA rotates: the bundle carries both CAs, and the reload
	// sidecar calls /-/reload, which needs no flag and no restart.
	webtlstest.ReplaceFile(t, bundle, append(oldCA.PEM(), newCA.PEM()...))
	code, body := postReload(t, fwdURL)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 0.0, metricsValue(t, fwdURL, "phonehome_forward_config_restart_required", nil))

	// Prometheus' serving certificate is re-issued by the new CA, and
	// Prometheus restarts with it: every connection is new.
	prom.Stop()
	newCA.ServerTo(t, "prometheus-k8s", cert, key)
	startTLSFixturePrometheus(t, promAddr, exporterHost, web, tlsClient(newCA))
	rotated := time.Now()
	waitFresh(t, recv.URL(), q, 4, rotated)

	// The old CA leaves the bundle: the forwarder goes on.
	webtlstest.ReplaceFile(t, bundle, newCA.PEM())
	waitCycles(t, fwdURL, metricsValue(t, fwdURL, "phonehome_forward_cycles_total", map[string]string{"result": "success"})+2)
	require.Equal(t, pid, fwd.cmd.Process.Pid)
	select {
	case <-fwd.done:
		t.Fatal("the forwarder exited")
	default:
	}
}
