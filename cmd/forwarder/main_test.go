package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/common/version"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/internal/buildversion"
)

// TestMain doubles as the forwarder binary when re-executed by startSelf.
func TestMain(m *testing.M) {
	if os.Getenv("FORWARDER_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// TestCheckConfigPrintsEveryProblemALine: under --check-config a bad
// configuration is plain text, one problem a line, not a log line (exit 2).
func TestCheckConfigPrintsEveryProblemALine(t *testing.T) {
	cfg := writeFile(t, "forwarder.yaml", "send:\n  timeout: 30seconds\n  timout: 1s\n")
	salt := writeFile(t, "salt", "0123456789abcdef0123456789abcdef\n")
	var stderr bytes.Buffer
	require.Equal(t, 2, run([]string{"--to=http://127.0.0.1:1", "--from=http://127.0.0.1:2", "--id=abc", "--match=up",
		"--anonymize-salt-file=" + salt, "--config.file=" + cfg, "--check-config"}, &stderr))
	require.Contains(t, stderr.String(), "forwarder: invalid configuration:\n")
	require.Contains(t, stderr.String(), "send.timeout: line 2: want a duration such as 30s, 5m or 1h30m, found a string\nsend.timout: line 3: unknown key\n")
}

func TestInvalidInputExits2WithEveryProblem(t *testing.T) {
	cfg := writeFile(t, "forwarder.yaml", "queue:\n  max_bytes: 1KiB\nunknown_key: 1\n")
	salt := writeFile(t, "salt", "short\n")
	var stderr bytes.Buffer
	code := run([]string{
		"--to=ftp://x", "--from=not a url", "--id=", "--match=up{", "--match-file=/nonexistent",
		"--label=novalue", "--rename=ALERTS", "--anonymize-labels=__name__", "--anonymize-salt-file=" + salt,
		"--to-token-file=/nonexistent-token", "--from-ca-file=/nonexistent-ca", "--interval=0s", "--authorize=bogus",
		"--config.file=" + cfg,
	}, &stderr)
	require.Equal(t, 2, code)
	out := stderr.String()
	for _, want := range []string{
		"invalid configuration",
		"unknown_key: line 3: unknown key",
		`--to \"ftp://x\"`,
		`--from \"not a url\"`,
		"--id: required",
		"--interval 0s",
		`--authorize \"bogus\"`,
		"--to-token-file",
		"--from-ca-file",
		"--match-file",
		`allowlist[0] \"up{\"`,
		`--label \"novalue\"`,
		`--rename \"ALERTS\"`,
		"anonymize salt: 5 bytes",
		`anonymize_labels[0] \"__name__\"`,
	} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "short", "secrets never appear in logs")
}

// TestMissingSaltFileIsOneProblem: a salt file that cannot be read is
// reported once, not again as a salt of 0 bytes.
func TestMissingSaltFileIsOneProblem(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "salt")
	var stderr bytes.Buffer
	require.Equal(t, 2, run([]string{"--to=http://127.0.0.1:1", "--from=http://127.0.0.1:2", "--id=abc", "--match=up",
		"--anonymize-salt-file=" + missing, "--check-config"}, &stderr))
	out := stderr.String()
	require.Contains(t, out, "--anonymize-salt-file: open "+missing+": no such file or directory")
	require.NotContains(t, out, "anonymize salt:", "one cause, one problem")

	var again bytes.Buffer
	require.Equal(t, 2, run([]string{"--to=http://127.0.0.1:1", "--from=http://127.0.0.1:2", "--id=abc", "--match=up",
		"--anonymize-salt-file=" + writeFile(t, "salt", "\n"), "--check-config"}, &again))
	require.Contains(t, again.String(), "anonymize salt: 0 bytes, need at least 16", "an empty file is still refused")
}

func TestBadFlagsExit2(t *testing.T) {
	for _, args := range [][]string{{"--nope"}, {"--log.level=loud"}, {"--log.format=xml"}, {"positional"}, {"--queue.max-bytes=lots"}} {
		var stderr bytes.Buffer
		require.Equal(t, 2, run(args, &stderr), "%v", args)
	}
}

func TestCheckConfig(t *testing.T) {
	salt := writeFile(t, "salt", "0123456789abcdef-salt\n")
	cfg := writeFile(t, "forwarder.yaml", "relabel_configs:\n  - action: labeldrop\n    regex: prometheus_replica\n")
	var stderr bytes.Buffer
	code := run([]string{
		"--to=http://127.0.0.1:1", "--from=http://127.0.0.1:2", "--id=abc",
		"--match-file=../../bench/testdata/telemetry-allowlist.txt", "--anonymize-salt-file=" + salt,
		"--label=region=eu", "--config.file=" + cfg, "--check-config",
	}, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Equal(t, "ok\n", stderr.String())
}

// self is a re-executed forwarder.
type self struct {
	cmd   *exec.Cmd
	addr  string
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func (s *self) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

func startSelf(t *testing.T, args ...string) *self {
	t.Helper()
	return startSelfIn(t, "", nil, args...)
}

// startSelfIn is startSelf in working directory dir ("": the test's) with
// extra environment variables env.
func startSelfIn(t *testing.T, dir string, env []string, args ...string) *self {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"--listen=127.0.0.1:0"}, args...)...)
	cmd.Env = append(append(os.Environ(), "FORWARDER_TEST_MAIN=1"), env...)
	cmd.Dir = dir
	pr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s := &self{cmd: cmd, done: make(chan struct{})}
	addrc := make(chan string, 1)
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			s.mu.Lock()
			s.lines = append(s.lines, sc.Text())
			s.mu.Unlock()
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" {
				addrc <- rec.Addr
			}
		}
	}()
	select {
	case s.addr = <-addrc:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-s.done
		_ = cmd.Wait()
		t.Fatalf("forwarder did not log a listen address:\n%s", s.log())
	}
	return s
}

// stop sends SIGTERM and requires exit status 0 within 30s.
func (s *self) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	require.NoError(t, s.cmd.Wait(), s.log())
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestDisabledServesHealthAndSendsNothing(t *testing.T) {
	for _, args := range [][]string{{"--disabled", "--to=http://127.0.0.1:1"}, {}} {
		s := startSelf(t, args...)
		code, _ := get(t, "http://"+s.addr+"/healthz")
		require.Equal(t, http.StatusOK, code)
		for _, path := range []string{"/readyz", "/healthz/ready"} { // the second is telemeter-client's
			code, _ = get(t, "http://"+s.addr+path)
			require.Equal(t, http.StatusOK, code, path)
		}
		code, body := get(t, "http://"+s.addr+"/metrics")
		require.Equal(t, http.StatusOK, code)
		for _, line := range strings.Split(body, "\n") { // only the reload's own metrics: nothing collects
			if strings.HasPrefix(line, "phonehome_forward_") {
				require.True(t, strings.HasPrefix(line, "phonehome_forward_config_"), line)
			}
		}
		s.stop(t)
		require.Equal(t, 1, strings.Count(s.log(), "telemetry disabled"))
	}
}

func TestForwardsFixtureAndStopsCleanly(t *testing.T) {
	fixture, err := os.ReadFile("../../bench/testdata/federate-sample.prom")
	require.NoError(t, err)
	prom := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer from-token" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(fixture)
	}))
	defer prom.Close()
	var (
		mu     sync.Mutex
		series int
		bodies [][]byte
	)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/write" { // e.g. no /authorize: --authorize=auto uses the token directly
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer to-token" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		b, _ := io.ReadAll(r.Body)
		raw, err := snappy.Decode(nil, b)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req prompb.WriteRequest
		if err := req.Unmarshal(raw); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		series += len(req.Timeseries)
		bodies = append(bodies, raw)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()

	dir := t.TempDir()
	s := startSelf(t,
		"--from="+prom.URL, "--from-token-file="+writeFile(t, "ft", "from-token\n"),
		"--to="+recv.URL, "--to-token-file="+writeFile(t, "tt", "to-token\n"),
		"--id=5f6c2a9e-3b1d-4c7e-9a0f-2d8e4b6c1a73", "--anonymize-salt-file="+writeFile(t, "salt", "0123456789abcdef-salt\n"),
		"--match-file=../../bench/testdata/telemetry-allowlist.txt",
		// The first collection comes within 10 % of the interval (issue 20's
		// random start), the second not before 54s: one cycle in this test.
		"--interval=1m",
		"--queue.dir="+filepath.Join(dir, "queue"),
	)
	eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return series >= 224 }, "224 series")
	code, _ := get(t, "http://"+s.addr+"/readyz")
	require.Equal(t, http.StatusOK, code)
	// The receiver has the series before the forwarder has read its answer
	// and counted them as sent.
	var metrics string
	eventually(t, func() bool {
		_, metrics = get(t, "http://"+s.addr+"/metrics")
		return strings.Contains(metrics, "phonehome_forward_sent_samples_total 224")
	}, "224 samples counted as sent")
	require.Contains(t, metrics, `phonehome_forward_filtered_samples_total{reason="allowlist"} 76`)
	s.stop(t)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 224, series)
	for _, b := range bodies {
		require.False(t, bytes.Contains(b, []byte("5f6c2a9e-3b1d-4c7e-9a0f-2d8e4b6c1a73")))
		require.True(t, bytes.Contains(b, []byte("sUTqYf4UzU0SdM5NcdUhdA")))
	}
	require.NotContains(t, s.log(), "to-token")
	require.NotContains(t, s.log(), "0123456789abcdef-salt")
}

// TestSecondForwarderOnAQueueDirExits1: the queue directory is locked; a
// second forwarder on it stops at start, saying why, instead of
// overwriting the first one's records.
func TestSecondForwarderOnAQueueDirExits1(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "queue")
	first, err := forward.OpenQueue(dir, slog.New(slog.DiscardHandler), nil, forward.QueueOptions{})
	require.NoError(t, err)
	defer first.Close()
	var stderr bytes.Buffer
	code := run([]string{
		"--from=http://127.0.0.1:1", "--to=http://127.0.0.1:2", "--id=abc", "--match=up",
		"--anonymize-salt-file=" + writeFile(t, "salt", "0123456789abcdef-salt\n"),
		"--queue.dir=" + dir, "--listen=127.0.0.1:0",
	}, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), "queue directory is in use by another forwarder")
}

// The forwarder reports its version (internal/buildversion; 0.1.0 for a
// build that names none) in --version, as in its User-Agent.
func TestVersion(t *testing.T) {
	require.Equal(t, "phonehome-forwarder/"+version.Version, userAgent)
	var stderr bytes.Buffer
	require.Equal(t, 0, run([]string{"--version"}, &stderr))
	require.Contains(t, stderr.String(), "forwarder, version "+buildversion.Base)
}
