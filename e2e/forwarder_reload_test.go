package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/relabel"
)

// reloadConfig is a forwarder --config.file that labels every series with
// reloaded="<generation>", so the receiver shows which relabeling applied.
func reloadConfig(generation string) string {
	return fmt.Sprintf(`send:
  min_backoff: 100ms
  max_backoff: 500ms
  flush_timeout: 2s
relabel_configs:
  - target_label: reloaded
    replacement: %q
`, generation)
}

// postReload asks the forwarder at base to reload and returns the status and body.
func postReload(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Post(base+"/-/reload", "", nil)
	require.NoError(t, err)
	return readResponse(t, resp)
}

func readResponse(t *testing.T, resp *http.Response) (int, string) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// waitFresh waits until every series of q in the receiver has a sample
// scraped after since: what the forwarder collected after since arrived.
func waitFresh(t *testing.T, recv, q string, series int, since time.Time) {
	t.Helper()
	eventually(t, 2*time.Minute, func() error {
		r := querySeries(t, recv, fmt.Sprintf("min(timestamp(%s)) and count(%s) == %d", q, q, series), time.Now())
		if len(r.Result) != 1 || len(r.Result[0].Value) != 2 {
			return fmt.Errorf("%s: not %d series yet", q, series)
		}
		ts, err := strconv.ParseFloat(strings.Trim(string(r.Result[0].Value[1]), `"`), 64)
		if err != nil {
			return err
		}
		if ts <= float64(since.UnixMilli())/1000 {
			return fmt.Errorf("%s: newest common sample at %v, before %v", q, ts, since)
		}
		return nil
	})
}

// The forwarder's selectors and relabeling change without a restart, on
// SIGHUP and on POST /-/reload; an invalid configuration and another salt
// are refused and the running policy stays.
func TestForwarderReloadE2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	prom := startFixturePrometheus(t, fixtureExporter(t))
	waitFederated(t, prom.URL())

	dir := t.TempDir()
	recv := startReceiver(t, writeForwarderReceiverConfig(t, dir, hashedID), filepath.Join(dir, "data"))
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	match := write("match", "cluster_version\n")
	cfg := write("forwarder.yaml", reloadConfig("0"))
	salt := write("salt", fwdSalt+"\n")
	fwd := startBinary(t, "forwarder", forwarderArgs(t, prom.URL(), recv.URL(), filepath.Join(dir, "queue"),
		"--interval=2s", "--match-file="+match, "--config.file="+cfg, "--anonymize-salt-file="+salt, "--web.enable-lifecycle")...)
	fwdURL := "http://" + fwd.Addr
	a := fmt.Sprintf(`cluster_version{_id=%q,reloaded=%%q}`, hashedID)
	b := fmt.Sprintf(`cluster_operator_up{_id=%q,reloaded=%%q}`, hashedID)

	start := time.Now()
	waitFresh(t, recv.URL(), fmt.Sprintf(a, "0"), 4, start)
	require.Empty(t, querySeries(t, recv.URL(), fmt.Sprintf(`cluster_operator_up{_id=%q}`, hashedID), time.Now()).Result,
		"B is not selected yet")

	// SIGHUP: B is selected and the new relabeling applies to A and B.
	write("match", "cluster_version\ncluster_operator_up\n")
	write("forwarder.yaml", reloadConfig("1"))
	require.NoError(t, fwd.cmd.Process.Signal(syscall.SIGHUP))
	eventually(t, time.Minute, func() error {
		if v := metricsValue(t, fwdURL, "phonehome_forward_config_reloads_total", map[string]string{"result": "success"}); v != 1 {
			return fmt.Errorf("%v successful reloads", v)
		}
		return nil
	})
	reloaded := time.Now()
	waitFresh(t, recv.URL(), fmt.Sprintf(a, "1"), 4, reloaded)
	waitFresh(t, recv.URL(), fmt.Sprintf(b, "1"), 27, reloaded)

	// POST /-/reload (--web.enable-lifecycle) answers once applied.
	write("forwarder.yaml", reloadConfig("2"))
	code, body := postReload(t, fwdURL)
	require.Equal(t, http.StatusOK, code, body)
	reloaded = time.Now()
	waitFresh(t, recv.URL(), fmt.Sprintf(b, "2"), 27, reloaded)
	require.Equal(t, 1.0, metricsValue(t, fwdURL, "phonehome_forward_config_last_reload_successful", nil))

	// An invalid match file: 500, counted, and the running policy goes on.
	write("match", "cluster_version\ncluster_operator_up{\n")
	code, body = postReload(t, fwdURL)
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, body, "invalid configuration")
	require.Contains(t, body, "cluster_operator_up{")
	require.Equal(t, 0.0, metricsValue(t, fwdURL, "phonehome_forward_config_last_reload_successful", nil))
	require.Equal(t, 1.0, metricsValue(t, fwdURL, "phonehome_forward_config_reloads_total", map[string]string{"result": "failure"}))
	waitFresh(t, recv.URL(), fmt.Sprintf(b, "2"), 27, time.Now())

	// Another salt would change the pseudonym: refused until a restart.
	write("match", "cluster_version\ncluster_operator_up\n")
	newSalt := "another-e2e-salt-0123456789"
	write("salt", newSalt+"\n")
	code, body = postReload(t, fwdURL)
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, body, "pseudonym")
	require.Equal(t, 1.0, metricsValue(t, fwdURL, "phonehome_forward_config_restart_required", nil))
	require.Equal(t, 0.0, metricsValue(t, fwdURL, "phonehome_forward_config_last_reload_successful", nil))
	cycles := metricsValue(t, fwdURL, "phonehome_forward_cycles_total", map[string]string{"result": "success"})
	waitCycles(t, fwdURL, cycles+1)
	resp, err := http.Get(fwdURL + "/federate") // what the last cycle sent
	require.NoError(t, err)
	code, last := readResponse(t, resp)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, last, hashedID, "the forwarder still sends the pseudonym it started with")
	require.NotContains(t, last, relabel.Anonymize([]byte(newSalt), fwdClusterID))
	waitFresh(t, recv.URL(), fmt.Sprintf(b, "2"), 27, time.Now())

	fwd.Stop()
	for _, line := range fwd.Logs() {
		require.NotContains(t, line, newSalt, "secrets never appear in logs")
		require.NotContains(t, line, fwdSalt)
	}
}
