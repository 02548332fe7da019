package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/relabel"
	"github.com/phonehome/phonehome/webtls/webtlstest"
)

const reloadTestSalt = "0123456789abcdef-salt"

// fakeSource serves two series and records the match[] of each fetch.
type fakeSource struct {
	mu      sync.Mutex
	matches []string
}

func (s *fakeSource) Fetch(ctx context.Context, fn func(*forward.Sample) error) (forward.FetchStats, error) {
	return s.FetchMatching(ctx, nil, fn)
}

func (s *fakeSource) FetchMatching(_ context.Context, matches []string, fn func(*forward.Sample) error) (forward.FetchStats, error) {
	s.mu.Lock()
	s.matches = matches
	s.mu.Unlock()
	now := time.Now().UnixMilli()
	for i, name := range []string{"metric_a", "metric_b"} {
		ls := labels.FromStrings("__name__", name, "pod", "p", "replica", "r")
		if err := fn(&forward.Sample{Labels: ls, T: now, V: float64(i)}); err != nil {
			return forward.FetchStats{}, err
		}
	}
	return forward.FetchStats{}, nil
}

func (s *fakeSource) lastMatches() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.matches
}

// reloadFixture is a forwarder built as run builds it, minus the actors,
// with its match, config and salt files in dir.
type reloadFixture struct {
	dir string
	src *fakeSource
	fwd *forward.Forwarder
	rl  *reloader
}

func (fx *reloadFixture) write(t *testing.T, name, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(fx.dir, name), []byte(content), 0o600))
}

func newReloadFixture(t *testing.T, match, config string, extra ...string) *reloadFixture {
	t.Helper()
	fx := &reloadFixture{dir: t.TempDir(), src: &fakeSource{}}
	fx.write(t, "match", match)
	fx.write(t, "forwarder.yaml", config)
	fx.write(t, "salt", reloadTestSalt+"\n")
	f, err := parseFlags(append([]string{
		"--to=http://127.0.0.1:1", "--from=http://127.0.0.1:2", "--id=abc",
		"--match-file=" + filepath.Join(fx.dir, "match"), "--config.file=" + filepath.Join(fx.dir, "forwarder.yaml"),
		"--anonymize-salt-file=" + filepath.Join(fx.dir, "salt"), "--queue.dir=" + filepath.Join(fx.dir, "queue"),
	}, extra...), io.Discard)
	require.NoError(t, err)
	s, err := load(f, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	logger := slog.New(slog.DiscardHandler)
	q, err := forward.OpenQueue(f.queueDir, logger, nil, forward.QueueOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	fx.fwd = forward.New(logger, nil, fx.src, s.policy, q, nil, forward.Options{})
	fx.rl = newReloader(logger, nil, f, s, fx.fwd)
	return fx
}

// collect runs one cycle and returns what it sent, in the text format.
func (fx *reloadFixture) collect(t *testing.T) string {
	t.Helper()
	require.NoError(t, fx.fwd.Collect(context.Background()))
	rec := httptest.NewRecorder()
	fx.fwd.LastCycleHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/federate", nil))
	return rec.Body.String()
}

func (fx *reloadFixture) reloads(result string) float64 {
	return testutil.ToFloat64(fx.rl.m.reloads.WithLabelValues(result))
}

func TestReloadAppliesSelectorsAndRelabeling(t *testing.T) {
	fx := newReloadFixture(t, "metric_a\n", "")
	out := fx.collect(t)
	require.Contains(t, out, "metric_a{")
	require.NotContains(t, out, "metric_b")
	require.Contains(t, out, `replica="r"`)
	require.Equal(t, []string{"metric_a"}, fx.src.lastMatches())

	fx.write(t, "match", "metric_a\nmetric_b\n")
	fx.write(t, "forwarder.yaml", "relabel_configs:\n  - action: labeldrop\n    regex: replica\n")
	require.NoError(t, fx.rl.Reload())

	out = fx.collect(t)
	require.Contains(t, out, "metric_a{")
	require.Contains(t, out, "metric_b{")
	require.NotContains(t, out, "replica", "the new relabel_configs apply")
	require.Equal(t, []string{"metric_a", "metric_b"}, fx.src.lastMatches(), "the federation asks for the new selectors")
	require.Equal(t, 1.0, fx.reloads("success"))
	require.Equal(t, 1.0, testutil.ToFloat64(fx.rl.m.lastSuccessful))
	require.Zero(t, testutil.ToFloat64(fx.rl.m.restartRequired))
}

func TestReloadKeepsThePolicyOfAnInvalidConfiguration(t *testing.T) {
	for name, change := range map[string]func(*testing.T, *reloadFixture){
		"match file":   func(t *testing.T, fx *reloadFixture) { fx.write(t, "match", "metric_b{\n") },
		"missing file": func(t *testing.T, fx *reloadFixture) { require.NoError(t, os.Remove(filepath.Join(fx.dir, "match"))) },
		"relabel config": func(t *testing.T, fx *reloadFixture) {
			fx.write(t, "forwarder.yaml", "relabel_configs:\n  - action: bogus\n")
		},
		"unknown key":      func(t *testing.T, fx *reloadFixture) { fx.write(t, "forwarder.yaml", "matches: [metric_b]\nnope: 1\n") },
		"short salt":       func(t *testing.T, fx *reloadFixture) { fx.write(t, "salt", "short\n") },
		"anonymize __name": func(t *testing.T, fx *reloadFixture) { fx.write(t, "forwarder.yaml", "anonymize_labels: [__name__]\n") },
	} {
		t.Run(name, func(t *testing.T) {
			fx := newReloadFixture(t, "metric_a\n", "")
			before := testutil.ToFloat64(fx.rl.m.lastSuccess)
			change(t, fx)
			err := fx.rl.Reload()
			require.ErrorContains(t, err, "invalid configuration")
			require.NotContains(t, err.Error(), "short", "secrets never appear in errors")

			out := fx.collect(t)
			require.Contains(t, out, "metric_a{")
			require.NotContains(t, out, "metric_b")
			require.Equal(t, 1.0, fx.reloads("failure"))
			require.Zero(t, testutil.ToFloat64(fx.rl.m.lastSuccessful))
			require.Equal(t, before, testutil.ToFloat64(fx.rl.m.lastSuccess))
		})
	}
}

func TestReloadRefusesAnotherPseudonym(t *testing.T) {
	fx := newReloadFixture(t, "metric_a\n", "")
	hashed := relabel.Anonymize([]byte(reloadTestSalt), "abc")
	require.Contains(t, fx.collect(t), hashed)

	fx.write(t, "salt", "another-salt-0123456789\n")
	fx.write(t, "match", "metric_a\nmetric_b\n")
	require.ErrorIs(t, fx.rl.Reload(), errPseudonymChanged)
	out := fx.collect(t)
	require.Contains(t, out, hashed, "the pseudonym stays")
	require.NotContains(t, out, "metric_b", "nothing of the refused configuration applies")
	require.Equal(t, 1.0, testutil.ToFloat64(fx.rl.m.restartRequired))
	require.Zero(t, testutil.ToFloat64(fx.rl.m.lastSuccessful))

	// The salt back as it was: the rest applies, no restart needed.
	fx.write(t, "salt", reloadTestSalt+"\n")
	require.NoError(t, fx.rl.Reload())
	require.Contains(t, fx.collect(t), "metric_b{")
	require.Zero(t, testutil.ToFloat64(fx.rl.m.restartRequired))
}

func TestRestartOnlyNamesSections(t *testing.T) {
	fx := newReloadFixture(t, "metric_a\n", "send:\n  timeout: 30s\n", "--queue.max-bytes=1MiB")
	// queue.max_bytes is overridden by the flag: not a change. The live
	// sections are applied, not flagged.
	fx.write(t, "forwarder.yaml", "send:\n  timeout: 10s\nqueue:\n  max_bytes: 2MiB\nfederate:\n  max_series: 10\nmatches: [metric_b]\nanonymize_labels: [pod]\n")
	require.NoError(t, fx.rl.Reload())
	require.Equal(t, 1.0, testutil.ToFloat64(fx.rl.m.restartRequired))
	next, err := load(fx.rl.flags, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Equal(t, []string{"federate", "send"}, fx.rl.restartOnly(next))
	out := fx.collect(t)
	require.Contains(t, out, "metric_b{", "the live sections apply")
	require.NotContains(t, out, `pod="p"`, "anonymize_labels apply")

	// Back as started: no restart needed any more.
	fx.write(t, "forwarder.yaml", "send:\n  timeout: 30s\n")
	require.NoError(t, fx.rl.Reload())
	require.Zero(t, testutil.ToFloat64(fx.rl.m.restartRequired))
}

// A changed CA bundle needs no restart: the clients re-read it themselves
// (webtls.CAFileTransport), so a reload after it (CMO's reload sidecar
// watches the service CA bundle) succeeds and flags nothing.
func TestReloadAfterCAFileChangeNeedsNoRestart(t *testing.T) {
	ca := webtlstest.NewCA(t, "one")
	fx := newReloadFixture(t, "metric_a\n", "", "--from-ca-file="+ca.File)
	other, err := os.ReadFile(webtlstest.NewCA(t, "two").File)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(ca.File, other, 0o600))
	require.NoError(t, fx.rl.Reload())
	require.Zero(t, testutil.ToFloat64(fx.rl.m.restartRequired))
	require.Equal(t, 1.0, fx.reloads("success"))
}

// newGatheringReloadFixture is newReloadFixture with --gathering-url=fleet
// and its poller, the local selectors in force until a definition arrives.
func newGatheringReloadFixture(t *testing.T, fleet *httptest.Server) (*reloadFixture, *gathering.Poller) {
	t.Helper()
	fx := newReloadFixture(t, "metric_a\n", "", "--gathering-url="+fleet.URL)
	p := gathering.NewPoller(slog.New(slog.DiscardHandler), nil, gathering.PollerOptions{
		URL: fleet.URL, Client: fleet.Client(), ForwarderVersion: forwarderVersion, Apply: fx.rl.applyDefinition,
	})
	fx.rl.poller = p
	p.UseLocal()
	return fx, p
}

func TestReloadWithGatheringReappliesTheDefinition(t *testing.T) {
	var (
		mu   sync.Mutex
		body = `{"version":"v1","selectors":["metric_b"]}`
	)
	fleet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = io.WriteString(w, body)
	}))
	defer fleet.Close()
	fx, p := newGatheringReloadFixture(t, fleet)

	// The local selectors are the fallback while no definition is in force:
	// a reload updates them.
	fx.write(t, "match", "metric_a\nmetric_b\n")
	require.NoError(t, fx.rl.Reload())
	require.Equal(t, []string{"metric_a", "metric_b"}, func() []string { fx.collect(t); return fx.src.lastMatches() }())

	// A definition decides the selectors; a reload keeps them and applies
	// the new local relabeling over them, and polls keep using it.
	require.NoError(t, p.Poll(context.Background()))
	out := fx.collect(t)
	require.NotContains(t, out, "metric_a")
	require.Contains(t, out, `replica="r"`)
	fx.write(t, "match", "metric_a\n")
	fx.write(t, "forwarder.yaml", "relabel_configs:\n  - action: labeldrop\n    regex: replica\n")
	require.NoError(t, fx.rl.Reload())
	out = fx.collect(t)
	require.Equal(t, []string{"metric_b"}, fx.src.lastMatches())
	require.Contains(t, out, "metric_b{")
	require.NotContains(t, out, "replica")

	mu.Lock()
	body = `{"version":"v2","selectors":["metric_a","metric_b"]}`
	mu.Unlock()
	require.NoError(t, p.Poll(context.Background()))
	out = fx.collect(t)
	require.Contains(t, out, "metric_a{")
	require.NotContains(t, out, "replica", "a new definition gets the reloaded relabeling")
}

func TestReloadEndpoint(t *testing.T) {
	fx := newReloadFixture(t, "metric_a\n", "")
	post := func(h http.Handler, method string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, "/-/reload", nil))
		return rec
	}
	rec := post(fx.rl.handler(false), http.MethodPost)
	require.Equal(t, http.StatusForbidden, rec.Code)
	require.Zero(t, fx.reloads("success")+fx.reloads("failure"), "no reload with --web.enable-lifecycle=false")

	for _, method := range []string{http.MethodPost, http.MethodPut} {
		require.Equal(t, http.StatusOK, post(fx.rl.handler(true), method).Code)
	}
	fx.write(t, "match", "metric_b{\n")
	rec = post(fx.rl.handler(true), http.MethodPost)
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Contains(t, rec.Body.String(), "invalid configuration")
	require.Equal(t, 2.0, fx.reloads("success"))
	require.Equal(t, 1.0, fx.reloads("failure"))
}

// A SIGHUP reloads the running binary, which neither exits nor stops serving.
func TestSIGHUPReloads(t *testing.T) {
	match := writeFile(t, "match", "metric_a\n")
	s := startSelf(t, "--to=http://127.0.0.1:1", "--from=http://127.0.0.1:2", "--id=abc",
		"--match-file="+match, "--anonymize-salt-file="+writeFile(t, "salt", reloadTestSalt+"\n"),
		"--queue.dir="+filepath.Join(t.TempDir(), "queue"), "--interval=1h", "--authorize=never")
	metric := func(line string) func() bool {
		return func() bool { _, body := get(t, "http://"+s.addr+"/metrics"); return strings.Contains(body, line) }
	}
	require.NoError(t, os.WriteFile(match, []byte("metric_b{\n"), 0o600))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	eventually(t, metric(`phonehome_forward_config_reloads_total{result="failure"} 1`), "a failed reload")
	require.True(t, metric("phonehome_forward_config_last_reload_successful 0")())

	require.NoError(t, os.WriteFile(match, []byte("metric_b\n"), 0o600))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	eventually(t, metric(`phonehome_forward_config_reloads_total{result="success"} 1`), "a reload")
	require.True(t, metric("phonehome_forward_config_last_reload_successful 1")())
	code, _ := get(t, "http://"+s.addr+"/healthz")
	require.Equal(t, http.StatusOK, code)
	s.stop(t)
	require.Contains(t, s.log(), "configuration reloaded")
}

// TestReloadWithoutLocalSelectorsStillRelabels: with --gathering-url and no
// definition yet, the local selectors are in force. A reload that drops
// them keeps them until a definition arrives, but its new relabelling
// (here an anonymized label) applies at once: a reload applies whole or not
// at all.
func TestReloadWithoutLocalSelectorsStillRelabels(t *testing.T) {
	fleet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.NotFound(w, nil) }))
	defer fleet.Close()
	fx, _ := newGatheringReloadFixture(t, fleet)
	require.Contains(t, fx.collect(t), `replica="r"`)

	fx.write(t, "match", "")
	fx.write(t, "forwarder.yaml", "anonymize_labels: [replica]\n")
	require.NoError(t, fx.rl.Reload())
	out := fx.collect(t)
	require.Contains(t, out, "metric_a", "the selectors in force stay")
	require.NotContains(t, out, `replica="r"`, "the reload's anonymize_labels are in force")
}

// TestSIGHUPDuringShutdownFlush: a SIGHUP (a config-reloader sidecar) while
// the forwarder's last flush runs at shutdown must not kill it with SIGHUP's
// default action: the flush ends and the forwarder exits 0.
func TestSIGHUPDuringShutdownFlush(t *testing.T) {
	prom := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte("metric_a{pod=\"p\"} 1\n"))
	}))
	defer prom.Close()
	hang := make(chan struct{})
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-hang:
		}
	}))
	defer recv.Close()
	defer close(hang)
	match := writeFile(t, "match", "metric_a\n")
	s := startSelf(t, "--to="+recv.URL, "--from="+prom.URL, "--id=abc",
		"--match-file="+match, "--anonymize-salt-file="+writeFile(t, "salt", reloadTestSalt+"\n"),
		"--queue.dir="+filepath.Join(t.TempDir(), "queue"), "--interval=1s", "--authorize=never")
	eventually(t, func() bool {
		_, body := get(t, "http://"+s.addr+"/metrics")
		return strings.Contains(body, `phonehome_forward_cycles_total{result="success"} `) &&
			!strings.Contains(body, `phonehome_forward_cycles_total{result="success"} 0`)
	}, "a cycle")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	// The forwarder stops last (after the reload actor): the SIGHUP lands in its last flush.
	eventually(t, func() bool { return strings.Contains(s.log(), "stopping: delivering what is queued") }, "the last flush")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	select {
	case <-s.done:
	case <-time.After(60 * time.Second): // the last flush is bounded by send.flush_timeout (10s)
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	require.NoError(t, s.cmd.Wait(), "a SIGHUP during the shutdown flush must not kill the forwarder: %s", s.log())
}

// TestReloadEndpointOnTheBinary: /-/reload as the process serves it: POST
// and PUT by default, as telemeter-client (cluster-monitoring-operator's
// reload sidecar POSTs it), refused with --web.enable-lifecycle=false.
func TestReloadEndpointOnTheBinary(t *testing.T) {
	for _, lifecycle := range []bool{true, false} {
		args := []string{"--disabled"}
		if !lifecycle {
			args = append(args, "--web.enable-lifecycle=false")
		}
		s := startSelf(t, args...)
		call := func(method string) int {
			req, err := http.NewRequest(method, "http://"+s.addr+"/-/reload", nil)
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_ = resp.Body.Close()
			return resp.StatusCode
		}
		want := http.StatusForbidden
		if lifecycle {
			want = http.StatusOK
		}
		require.Equal(t, want, call(http.MethodPost), "lifecycle=%v", lifecycle)
		require.Equal(t, want, call(http.MethodPut), "lifecycle=%v", lifecycle)
		require.Equal(t, http.StatusMethodNotAllowed, call(http.MethodGet))
		s.stop(t)
	}
}
