package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/forward/telemetertest"
	"github.com/phonehome/phonehome/webtls/webtlstest"
)

const (
	rawClusterID = "5f6c2a9e-3b1d-4c7e-9a0f-2d8e4b6c1a73"
	testSalt     = "0123456789abcdef-salt"
	hashedID     = "sUTqYf4UzU0SdM5NcdUhdA" // of rawClusterID with testSalt
)

// cmoFiles are stand-ins for the files the CMO deployment mounts.
type cmoFiles struct {
	dir                  string
	cert, key, ca        string
	saToken, token, salt string
}

func newCMOFiles(t *testing.T) *cmoFiles {
	t.Helper()
	dir := t.TempDir()
	c := &cmoFiles{
		dir: dir, cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"),
		ca: filepath.Join(dir, "service-ca.crt"), saToken: filepath.Join(dir, "sa-token"),
		token: filepath.Join(dir, "token"), salt: filepath.Join(dir, "salt"),
	}
	ca := webtlstest.NewCA(t, "cmo")
	c.cert, c.key = ca.Client(t, "telemeter-client")
	require.NoError(t, os.WriteFile(c.ca, mustRead(t, ca.File), 0o600)) // replaced where a server is real
	require.NoError(t, os.WriteFile(c.saToken, []byte("from-token\n"), 0o600))
	require.NoError(t, os.WriteFile(c.token, []byte("fleet-token\n"), 0o600))
	require.NoError(t, os.WriteFile(c.salt, []byte(testSalt), 0o600))
	return c
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}

// cmoArgs is the fixture's argument list as the kubelet would run it: the
// command dropped, $(VAR) expanded from env, the mounted paths mapped to files.
func cmoArgs(t *testing.T, env map[string]string, files *cmoFiles) []string {
	t.Helper()
	f, err := os.Open("testdata/cmo-telemeter-client-args.txt")
	require.NoError(t, err)
	defer f.Close()
	paths := strings.NewReplacer(
		"/etc/tls/private/tls.crt", files.cert,
		"/etc/tls/private/tls.key", files.key,
		"/etc/serving-certs-ca-bundle/service-ca.crt", files.ca,
		"/var/run/secrets/kubernetes.io/serviceaccount/token", files.saToken,
		"/etc/telemeter/token", files.token,
		"/etc/telemeter/salt", files.salt,
	)
	var args []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if args == nil { // the command
			require.Equal(t, "/usr/bin/telemeter-client", line)
			args = []string{}
			continue
		}
		for k, v := range env {
			line = strings.ReplaceAll(line, "$("+k+")", v)
		}
		require.NotContains(t, line, "$(", "unexpanded variable")
		args = append(args, paths.Replace(line))
	}
	require.NoError(t, sc.Err())
	return args
}

func cmoEnv(from, to string) map[string]string {
	return map[string]string{"ID": rawClusterID, "FROM": from, "TO": to, "ANONYMIZE_LABELS": ""}
}

func TestCMODeploymentArgsAccepted(t *testing.T) {
	files := newCMOFiles(t)
	args := cmoArgs(t, cmoEnv("https://prometheus-k8s.openshift-monitoring.svc:9091", "https://infogw.api.openshift.com"), files)
	require.Len(t, args, 11+211+1)
	require.Contains(t, args, "--anonymize-labels=")

	var stderr bytes.Buffer
	require.Equal(t, 0, run(append(args, "--check-config"), &stderr), stderr.String())
	require.Equal(t, "ok\n", stderr.String(), "no warning: every secret comes from a file")

	f, err := parseFlags(args, io.Discard)
	require.NoError(t, err)
	s, err := load(f, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Len(t, f.matches, 211)
	require.Empty(t, f.anonymizeLabels)
	require.Equal(t, "localhost:8080", f.listen)
	require.EqualValues(t, 5242880, s.file.Federate.MaxBytes)
	require.Equal(t, forward.ProtocolAuto, s.protocol, "the /authorize answer decides")
	require.Equal(t, "https://infogw.api.openshift.com/upload", s.toUpload)
	require.Equal(t, hashedID, s.policy.Rules.HashedID())
}

func TestTelemeterClientFlags(t *testing.T) {
	files := newCMOFiles(t)
	var stderr bytes.Buffer
	code := run([]string{
		"--from=https://prometheus.example:9091/federate", "--from-token=inline-from-secret",
		"--to-upload=https://infogw.example/upload", "--to-auth=https://infogw.example/authorize?id=" + rawClusterID,
		"--to-token=inline-to-secret", "--to-token-file=" + files.token,
		"--id=" + rawClusterID, "--anonymize-salt=" + testSalt + "-inline",
		"--anonymize-labels=namespace,pod", "--anonymize-labels", "node",
		"--label=a=1,b=2", "--label", "c=3", "--rename=ALERTS=alerts,up=up2",
		"--match={__name__=\"up\"}", "--match={__name__=~\"a|b\",job=\"x,y\"}",
		"-v", "--log-level=warn", "--limit-bytes=204800",
		"--check-config",
	}, &stderr)
	require.Equal(t, 0, code, stderr.String())
	out := stderr.String()
	for _, flag := range []string{"--from-token", "--to-token", "--anonymize-salt"} {
		require.Contains(t, out, `"flag":"`+flag+`"`)
	}
	require.Contains(t, out, `"file_flag_ignored":true`, "--to-token overrides --to-token-file")
	for _, secret := range []string{"inline-from-secret", "inline-to-secret", testSalt} {
		require.NotContains(t, out, secret)
	}

	f, err := parseFlags([]string{
		"--to=https://t.example", "--label=a=1,b=2", "--label", "c=3", "--anonymize-labels=namespace,pod",
		"--anonymize-labels=", "--rename=", "-v",
	}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, sliceFlag{"a=1", "b=2", "c=3"}, f.labels)
	require.Equal(t, sliceFlag{"namespace", "pod"}, f.anonymizeLabels)
	require.Empty(t, f.renames)
	require.Equal(t, "debug", f.logLevel, "-v without a level")
	f, err = parseFlags([]string{"--verbose", "--log.level=error"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "error", f.logLevel)

	f, err = parseFlags([]string{
		"--from=https://p.example/federate", "--to-upload=https://u.example/upload", "--to-auth=https://u.example/authorize",
		"--to-token-file=" + files.token, "--id=x", "--anonymize-salt-file=" + files.salt, "--match=up",
	}, io.Discard)
	require.NoError(t, err)
	s, err := load(f, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Equal(t, forward.ProtocolTelemeter, s.protocol, "--to-upload/--to-auth: telemeter")
	require.Equal(t, "https://p.example", s.from.String(), "a federate URL is accepted")
	require.Equal(t, "https://u.example/upload", s.toUpload)
	require.Equal(t, "ALERTS=alerts", func() string {
		for k, v := range s.relabel.Rename {
			return k + "=" + v
		}
		return ""
	}())
}

func TestTelemeterFlagProblemsExit2(t *testing.T) {
	files := newCMOFiles(t)
	var stderr bytes.Buffer
	code := run([]string{
		"--from=http://127.0.0.1:1", "--id=x", "--anonymize-salt-file=" + files.salt, "--match=up",
		"--to-upload=http://127.0.0.1:2/upload", "--to-protocol=remote-write",
		"--tls-cert-file=" + files.cert, "--limit-bytes=-1",
	}, &stderr)
	require.Equal(t, 2, code)
	out := stderr.String()
	for _, want := range []string{
		"--to-upload and --to-auth: both are needed without --to",
		"not for --to-protocol=remote-write",
		"give both or neither",
		"--limit-bytes -1",
	} {
		require.Contains(t, out, want)
	}

	stderr.Reset()
	code = run([]string{
		"--from=http://127.0.0.1:1", "--to=http://127.0.0.1:2", "--id=x", "--anonymize-salt-file=" + files.salt,
		"--match=up", "--to-protocol=telemeter", "--tls-cert-file=" + files.key, "--tls-private-key-file=" + files.cert,
	}, &stderr)
	require.Equal(t, 2, code)
	require.Contains(t, stderr.String(), "telemeter protocol: needs --to-token-file")
	require.Contains(t, stderr.String(), "--tls-cert-file/--tls-private-key-file")

	stderr.Reset()
	require.Equal(t, 2, run([]string{"--to-protocol=grpc", "--check-config"}, &stderr))
	require.Contains(t, stderr.String(), `--to-protocol "grpc"`)
}

// cmoRun is the forwarder started with the CMO-rendered arguments
// (unchanged but for the environment, a free port and extra), against a
// Prometheus that wants the client certificate and the service-account
// token, and a telemeter-server stand-in. The working directory is not
// writable, as in the telemeter-client image, so the queue goes to the
// temporary directory.
type cmoRun struct {
	s         *self
	telemeter *telemetertest.Server
	fixtureTS map[int64]bool // the timestamps Prometheus federates
	tmp       string         // $TMPDIR
}

// startCMO starts a cmoRun; prepare, if set, readies the stand-in first.
func startCMO(t *testing.T, prepare func(*telemetertest.Server), extra ...string) cmoRun {
	t.Helper()
	// The fixture's samples moved to the last minute, as a cluster's
	// Prometheus federates them: telemeter-server, and so the forwarder,
	// take none older than a day.
	fixture, fixtureTS := recentFixture(t, mustRead(t, "../../bench/testdata/federate-sample.prom"), time.Now().Add(-time.Minute))
	prom := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/federate" || r.Header.Get("Authorization") != "Bearer from-token" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "no client certificate", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(fixture)
	}))
	prom.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS12}
	prom.StartTLS()
	t.Cleanup(prom.Close)
	telemeter := telemetertest.NewServer("fleet-token")
	telemeter.MaxAge = forward.DefaultTelemeterMaxAge // telemeter-server's
	t.Cleanup(telemeter.Close)
	if prepare != nil {
		prepare(telemeter)
	}

	files := newCMOFiles(t)
	require.NoError(t, os.WriteFile(files.ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: prom.Certificate().Raw}), 0o600))
	args := cmoArgs(t, cmoEnv(prom.URL, telemeter.URL), files)
	for i, a := range args {
		if a == "--listen=localhost:8080" {
			args[i] = "--listen=127.0.0.1:0" // a free port
		}
	}
	cwd := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cwd, "data"), nil, 0o600)) // no data/queue here
	tmp := t.TempDir()
	s := startSelfIn(t, cwd, []string{"TMPDIR=" + tmp}, append(args, extra...)...)
	return cmoRun{s: s, telemeter: telemeter, fixtureTS: fixtureTS, tmp: tmp}
}

// TestCMODeploymentDeliversToTelemeterServer: the CMO deployment's
// arguments deliver a cycle to a telemeter-server, as telemeter-client
// does, with only the hashed id, and without the external labels the
// cluster's Prometheus adds on /federate (telemeter-client's --elide-label
// default, which CMO relies on: it passes no --elide-label).
func TestCMODeploymentDeliversToTelemeterServer(t *testing.T) {
	fixture := string(mustRead(t, "../../bench/testdata/federate-sample.prom"))
	require.Contains(t, fixture, `prometheus="openshift-monitoring/k8s",prometheus_replica="prometheus-k8s-0"`, "federated as /federate adds them")

	// The one addition: --interval=1m instead of the default 4m30s, so the
	// randomly delayed first collection comes within 6s, and a second one
	// not before 54s, after this test.
	run := startCMO(t, nil, "--interval=1m")
	s, telemeter := run.s, run.telemeter

	eventually(t, func() bool { return telemeter.Samples() >= 224 }, "224 samples at the telemeter-server")
	var metrics string
	eventually(t, func() bool {
		_, metrics = get(t, "http://"+s.addr+"/metrics")
		return strings.Contains(metrics, "phonehome_forward_sent_samples_total 224")
	}, "224 samples counted as sent")
	require.Contains(t, metrics, `phonehome_forward_delivery_protocol{protocol="telemeter"} 1`)
	s.stop(t)

	require.Equal(t, 224, telemeter.Samples())
	require.Empty(t, telemeter.Rejections())
	for _, id := range telemeter.AuthorizeIDs() {
		require.Equal(t, hashedID, id, "only the hashed id leaves the cluster")
	}
	for _, mf := range telemeter.Families() {
		for _, m := range mf.GetMetric() {
			require.True(t, run.fixtureTS[m.GetTimestampMs()], "original timestamp kept: %d", m.GetTimestampMs())
			for _, l := range m.GetLabel() {
				require.NotContains(t, l.GetValue(), rawClusterID)
				require.NotContains(t, []string{"prometheus", "prometheus_replica"}, l.GetName(), "elided")
				if l.GetName() == "_id" {
					require.Equal(t, hashedID, l.GetValue())
				}
			}
		}
	}
	log := s.log()
	require.Contains(t, log, "queueing in the temporary directory")
	require.Contains(t, log, `"protocol":"telemeter"`)
	require.DirExists(t, filepath.Join(run.tmp, "phonehome-forwarder-queue"))
	require.NotContains(t, log, "fleet-token")
	require.NotContains(t, log, testSalt)
}

// TestCMODeploymentAfterATelemeterServerOutage: a stock telemeter-server
// stores every upload as current, so after its outage the forwarder sends
// the latest cycle, not the backlog, and a cycle in one upload although
// send.max_samples_per_request is below its 224 samples.
func TestCMODeploymentAfterATelemeterServerOutage(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "forwarder.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("send: {max_samples_per_request: 50}\n"), 0o600))
	outage := []int{http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusServiceUnavailable}
	run := startCMO(t, func(ts *telemetertest.Server) { ts.FailNext(outage...) },
		"--interval=1s", "--config.file="+cfg)
	s, telemeter := run.s, run.telemeter

	superseded := regexp.MustCompile(`phonehome_forward_dropped_samples_total\{reason="superseded"\} [1-9]`)
	eventually(t, func() bool {
		_, metrics := get(t, "http://"+s.addr+"/metrics")
		return superseded.MatchString(metrics) && len(telemeter.UploadSizes()) >= 2
	}, "cycles queued during the outage superseded, two uploads after it")
	s.stop(t)

	require.Len(t, telemeter.Rejections(), len(outage))
	sizes := telemeter.UploadSizes()
	require.Equal(t, 224, sizes[len(sizes)-1], "a cycle is one upload: %v", sizes)
	require.Contains(t, s.log(), "delivering the latest cycle, dropping the older ones")
}

// recentFixture shifts the timestamps of a text-format fixture so that its
// newest sample is at newest, and returns it with the set of its timestamps.
func recentFixture(t *testing.T, fixture []byte, newest time.Time) ([]byte, map[int64]bool) {
	t.Helper()
	lines := strings.Split(string(fixture), "\n")
	ts := map[int]int64{} // by line: the sample's timestamp, the line's last field
	for i, line := range lines {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseInt(line[strings.LastIndexByte(line, ' ')+1:], 10, 64)
		require.NoError(t, err)
		ts[i] = v
	}
	shift := newest.UnixMilli() - slices.Max(slices.Collect(maps.Values(ts)))
	shifted := map[int64]bool{}
	for i, v := range ts {
		lines[i] = lines[i][:strings.LastIndexByte(lines[i], ' ')+1] + strconv.FormatInt(v+shift, 10)
		shifted[v+shift] = true
	}
	return []byte(strings.Join(lines, "\n")), shifted
}

// The --interval default that README.md and docs/migrating-from-telemeter.md
// state: telemeter-client's 4m30s.
func TestIntervalDefault(t *testing.T) {
	f, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 4*time.Minute+30*time.Second, f.interval)
}
