package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientpush "github.com/prometheus/client_golang/prometheus/push"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	pushclient "github.com/phonehome/phonehome/push/client"
)

const pushToken = "push-s3cret"

// pushReceiverConfig writes a tokens file (tenant "installs") and a
// receiver config with a fast push flush into dir.
func pushReceiverConfig(t *testing.T, dir string) string {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"),
		[]byte("tokens:\n- token: "+pushToken+"\n  tenant: installs\n"), 0o600))
	cfg := `auth:
  tokens_file: tokens.yaml
push:
  flush_interval: 1s
  rate_limit: {requests_per_second: 100000, burst: 100000}
`
	p := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(p, []byte(cfg), 0o600))
	return p
}

func pushStartReceiver(t *testing.T, cfgPath, storagePath string) *Process {
	t.Helper()
	p := startBinary(t, "receiver", "--config.file="+cfgPath, "--storage.path="+storagePath,
		"--web.listen-address=127.0.0.1:0", "--log.format=json")
	waitHTTP(t, p.URL()+"/-/ready", http.StatusOK)
	return p
}

// pushQueryValue runs an instant query for a single-series result.
func pushQueryValue(base, q string) (float64, error) {
	req, err := http.NewRequest(http.MethodGet, base+"/api/v1/query?"+url.Values{"query": {q}}.Encode(), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+pushToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Data   struct {
			Result []struct {
				Value [2]json.RawMessage `json:"value"`
			} `json:"result"`
		} `json:"data"`
		Error string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, err
	}
	if out.Status != "success" || len(out.Data.Result) != 1 {
		return 0, fmt.Errorf("query %s: status %q, %d series, %s", q, out.Status, len(out.Data.Result), out.Error)
	}
	var s string
	if err := json.Unmarshal(out.Data.Result[0].Value[1], &s); err != nil {
		return 0, err
	}
	return strconv.ParseFloat(s, 64)
}

// pushWaitValue polls q until it returns want.
func pushWaitValue(t *testing.T, base, q string, want float64) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		v, err := pushQueryValue(base, q)
		if err != nil {
			return err
		}
		if v != want {
			return fmt.Errorf("%s = %g, want %g", q, v, want)
		}
		return nil
	})
}

// clientGolangPush pushes one installer run with the real client_golang push client.
func clientGolangPush(base, platform string, add bool) error {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cluster_installation_invocation", Help: "Installer invocations."},
		[]string{"command", "platform", "result"})
	c.WithLabelValues("create", platform, "success").Inc()
	reg.MustRegister(c)
	p := clientpush.New(base, "installer").Gatherer(reg).Client(&http.Client{Timeout: 30 * time.Second}).
		Header(http.Header{"Authorization": {"Bearer " + pushToken}})
	if add {
		return p.Add()
	}
	return p.Push()
}

// ownClientPush pushes one installer run with push/client.
func ownClientPush(base, platform string) error {
	c := pushclient.New(pushclient.Options{URL: base, Token: pushToken, Timeout: 30 * time.Second, Getenv: func(string) string { return "" }})
	c.Counter("cluster_installation_invocation", "Installer invocations.").
		AddLabelValue("command", "create").AddLabelValue("platform", platform).AddLabelValue("result", "success")
	return c.Push(context.Background())
}

func pushRaw(t *testing.T, base, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, base+"/metrics/job/installer", strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func pushRejected(t *testing.T, base, reason string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	for _, m := range mfs["phonehome_push_rejected_total"].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "reason" && lp.GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

const (
	qAWS = `cluster_installation_invocation{job="installer",command="create",platform="aws",result="success"}`
	qGCP = `cluster_installation_invocation{job="installer",command="create",platform="gcp",result="success"}`
)

func TestPushAggregatesSurvivesKillAndRejects(t *testing.T) {
	dir := t.TempDir()
	cfgPath := pushReceiverConfig(t, dir)
	storagePath := filepath.Join(dir, "data")
	rcv := pushStartReceiver(t, cfgPath, storagePath)
	base := rcv.URL()

	// 1000 installer runs push concurrently: half through client_golang
	// (Push and Add alternating, platform aws), half through push/client
	// (platform gcp). The sums are exact.
	const runs = 1000
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	errs := make(chan error, runs)
	for i := 0; i < runs; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if i%2 == 0 {
				errs <- clientGolangPush(base, "aws", i%4 == 0)
			} else {
				errs <- ownClientPush(base, "gcp")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	pushWaitValue(t, base, qAWS, runs/2)
	pushWaitValue(t, base, qGCP, runs/2)

	// Bad pushes are refused, counted, and change nothing.
	code, body := pushRaw(t, base, "", "# TYPE cluster_installation_invocation counter\ncluster_installation_invocation 1\n")
	require.Equal(t, http.StatusUnauthorized, code, body)
	code, body = pushRaw(t, base, pushToken, "# TYPE evil_total counter\nevil_total 1\n")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "allowlist")
	code, body = pushRaw(t, base, pushToken, "cluster_installation_invocation{platform=\"aws\"} 1\n")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "untyped")
	code, body = pushRaw(t, base, pushToken, "# TYPE cluster_installation_invocation gauge\ncluster_installation_invocation 1\n")
	require.Equal(t, http.StatusBadRequest, code, body)
	code, body = pushRaw(t, base, pushToken, "# TYPE cluster_installation_invocation counter\n#"+strings.Repeat("x", 2<<20)+"\n")
	require.Equal(t, http.StatusRequestEntityTooLarge, code, body)
	require.Equal(t, 1.0, pushRejected(t, base, "unauthenticated"))
	require.Equal(t, 1.0, pushRejected(t, base, "not_allowed"))
	require.Equal(t, 1.0, pushRejected(t, base, "untyped"))
	require.Equal(t, 1.0, pushRejected(t, base, "type_mismatch"))
	require.Equal(t, 1.0, pushRejected(t, base, "too_large"))

	// SIGKILL in the middle of pushes: every acknowledged push is counted
	// exactly once (a push whose answer was lost may or may not count).
	var acked, failed atomic.Int64
	stop := make(chan struct{})
	var pushers sync.WaitGroup
	for w := 0; w < 4; w++ {
		pushers.Add(1)
		go func() {
			defer pushers.Done()
			for k := 0; k < 10000; k++ { // bounded
				select {
				case <-stop:
					return
				default:
				}
				if err := ownClientPush(base, "aws"); err != nil {
					failed.Add(1)
					return
				}
				acked.Add(1)
			}
		}()
	}
	eventually(t, 30*time.Second, func() error {
		if acked.Load() < 50 {
			return fmt.Errorf("%d pushes acknowledged so far", acked.Load())
		}
		return nil
	})
	rcv.Kill()
	close(stop)
	pushers.Wait()
	t.Logf("acknowledged %d pushes before SIGKILL, %d failed", acked.Load(), failed.Load())

	rcv = pushStartReceiver(t, cfgPath, storagePath)
	base = rcv.URL()
	var got float64
	eventually(t, 30*time.Second, func() error {
		v, err := pushQueryValue(base, qAWS)
		if err != nil {
			return err
		}
		lo, hi := float64(runs/2+acked.Load()), float64(runs/2+acked.Load()+failed.Load())
		if v < lo || v > hi {
			return fmt.Errorf("%s = %g after restart, want in [%g, %g]", qAWS, v, lo, hi)
		}
		got = v
		return nil
	})
	pushWaitValue(t, base, qGCP, runs/2)

	// Further pushes keep summing on the recovered state.
	for i := 0; i < 3; i++ {
		require.NoError(t, clientGolangPush(base, "aws", true))
		require.NoError(t, ownClientPush(base, "gcp"))
	}
	pushWaitValue(t, base, qAWS, got+3)
	pushWaitValue(t, base, qGCP, runs/2+3)

	// The opt-out sends nothing.
	c := pushclient.New(pushclient.Options{URL: base, Token: pushToken, Getenv: func(k string) string {
		return map[string]string{pushclient.EnvDisabled: "1"}[k]
	}})
	c.Counter("cluster_installation_invocation", "h").AddLabelValue("command", "create").
		AddLabelValue("platform", "gcp").AddLabelValue("result", "success")
	require.NoError(t, c.Push(context.Background()))
	v, err := pushQueryValue(base, qGCP)
	require.NoError(t, err)
	require.Equal(t, float64(runs/2+3), v)
}

// TestPushComparedWithPushgateway pushes the same runs with the same client
// to Debian's prometheus-pushgateway and to the receiver: the Pushgateway
// replaces (it serves the last push), phonehome sums.
func TestPushComparedWithPushgateway(t *testing.T) {
	addr := freeAddr(t)
	pgw := startProcess(t, "/usr/bin/prometheus-pushgateway", "pushgateway",
		[]string{"--web.listen-address=" + addr}, func(line string) (string, bool) {
			return addr, strings.Contains(line, "Listening on")
		})
	waitHTTP(t, pgw.URL()+"/-/ready", http.StatusOK)

	dir := t.TempDir()
	rcv := pushStartReceiver(t, pushReceiverConfig(t, dir), filepath.Join(dir, "data"))

	for _, base := range []string{pgw.URL(), rcv.URL()} {
		for i := 0; i < 3; i++ {
			require.NoError(t, clientGolangPush(base, "aws", i%2 == 1)) // Push, Add, Push
		}
	}

	resp, err := http.Get(pgw.URL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	ms := mfs["cluster_installation_invocation"].GetMetric()
	require.Len(t, ms, 1)
	require.Equal(t, 1.0, ms[0].GetCounter().GetValue(), "the Pushgateway keeps only the last push")
	require.Contains(t, mfs, "push_time_seconds", "the Pushgateway adds its own series")

	pushWaitValue(t, rcv.URL(), qAWS, 3) // phonehome sums
}
