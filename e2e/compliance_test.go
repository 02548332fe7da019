package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// The prometheus/compliance remote-write receiver suite, at the newest
// version the module proxy serves (it has no tags). It is built with its
// own go.mod, not ours: it pins an older Prometheus.
const (
	complianceModule  = "github.com/prometheus/compliance/remotewrite"
	complianceVersion = "v0.0.0-20260223092825-818283e1171e"
)

// TestComplianceRemoteWriteReceiver runs the prometheus/compliance
// remote-write receiver suite against the real receiver binary. Every case
// must pass: none is skipped.
func TestComplianceRemoteWriteReceiver(t *testing.T) {
	suite := buildComplianceSuite(t)

	dir := t.TempDir()
	rcv := startReceiver(t, writeReceiverConfig(t, dir, "", ""), filepath.Join(dir, "data"))
	cfg := filepath.Join(dir, "compliance.yml")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil,
		"remote_write:\n- name: phonehome\n  url: %s/api/v1/write\n  authorization: {credentials: %s}\n", rcv.URL(), tokenAcme), 0o600))

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, suite.bin, "-test.v", "-test.count=1")
	cmd.Dir = suite.dir // it reads nothing there, but keep it where its files are
	cmd.Env = append(os.Environ(), "PROMETHEUS_RW2_COMPLIANCE_CONFIG_FILE="+cfg)
	out, err := cmd.CombinedOutput()
	t.Logf("compliance suite output:\n%s", out)
	require.NoError(t, err, "the compliance suite failed; see its output above")

	// Every top-level case ran and passed.
	passed := regexp.MustCompile(`(?m)^--- PASS: (Test\w+)`).FindAllSubmatch(out, -1)
	skipped := regexp.MustCompile(`(?m)^--- SKIP: (Test\w+)`).FindAllSubmatch(out, -1)
	require.GreaterOrEqual(t, len(passed), 39, "the suite had 39 cases when this test was written")
	require.Empty(t, skipped, "a SKIP is the suite's own and needs a look")
	require.NotContains(t, string(out), "--- FAIL")
	t.Logf("compliance: all %d cases passed", len(passed))
}

// TestComplianceUnsortedRW1Labels is the suite's TestRW1BasicCompatibility
// request as it is (labels from a Go map, so in random order; 1.0 content
// type, no version header): the receiver accepts and stores both series,
// sorted, as Prometheus does.
func TestComplianceUnsortedRW1Labels(t *testing.T) {
	dir := t.TempDir()
	rcv := startReceiver(t, writeReceiverConfig(t, dir, "", ""), filepath.Join(dir, "data"))
	now := time.Now()
	series := func(name string, extra ...string) prompb.TimeSeries {
		// Names in reverse order: unsorted whatever a map would have done.
		ls := []prompb.Label{}
		for i := len(extra) - 2; i >= 0; i -= 2 {
			ls = append(ls, prompb.Label{Name: extra[i], Value: extra[i+1]})
		}
		ls = append(ls, prompb.Label{Name: "__name__", Value: name})
		return prompb.TimeSeries{Labels: ls, Samples: []prompb.Sample{{Value: 1, Timestamp: now.UnixMilli()}}}
	}
	raw, err := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		series("up", "instance", "localhost:9090", "job", "testjob"),
		series("http_requests_total", "method", "GET", "job", "testjob"),
	}}).Marshal()
	require.NoError(t, err)
	r, err := http.NewRequest(http.MethodPost, rcv.URL()+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, raw)))
	require.NoError(t, err)
	r.Header.Set("Content-Type", "application/x-protobuf")
	r.Header.Set("Content-Encoding", "snappy")
	r.Header.Set("Authorization", "Bearer "+tokenAcme)
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Empty(t, resp.Header.Get("X-Prometheus-Remote-Write-Samples-Written"), "1.0 responses carry no counts, as Prometheus'")

	got := instant(t, rcv.URL(), tokenAcme, `{job="testjob"}`, now.Add(time.Second)).Result
	require.Len(t, got, 2)
	require.InDelta(t, 2, metricValue(scrapeMetrics(t, rcv.URL()), "phonehome_receive_unsorted_series_total", nil), 0)
}

type complianceSuite struct{ dir, bin string }

// buildComplianceSuite fetches the suite through the module proxy (go mod
// download, as for any module), copies it and compiles its receiver tests
// into a binary. The copy gets one fix: this version still sets
// TimeSeries.CreatedTimestamp, which Remote-Write 2.0 rc.4 (the Prometheus
// it pins, and ours) moved into each sample and histogram as
// StartTimestamp; without it the suite does not compile.
func buildComplianceSuite(t *testing.T) complianceSuite {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	goCmd := func(dir string, args ...string) []byte {
		t.Helper()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
		// Outside our module: its go.mod, not ours, decides.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "go %s: %s", strings.Join(args, " "), stderr.String())
		return out
	}
	tmp := t.TempDir()
	var mod struct{ Dir string }
	require.NoError(t, json.Unmarshal(goCmd(tmp, "mod", "download", "-json", complianceModule+"@"+complianceVersion), &mod))
	require.NotEmpty(t, mod.Dir)

	src := filepath.Join(tmp, "remotewrite")
	require.NoError(t, os.CopyFS(src, os.DirFS(mod.Dir)))
	require.NoError(t, filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(p, mode) // the module cache is read-only
	}))
	helpers := filepath.Join(src, "receiver", "helpers_test.go")
	b, err := os.ReadFile(helpers)
	require.NoError(t, err)
	for old, fixed := range map[string]string{
		"ts.CreatedTimestamp = s.CreatedTimestamp.UnixMilli()":  "ts.Samples[0].StartTimestamp = s.CreatedTimestamp.UnixMilli()",
		"ts.CreatedTimestamp = hw.CreatedTimestamp.UnixMilli()": "ts.Histograms[0].StartTimestamp = hw.CreatedTimestamp.UnixMilli()",
	} {
		require.Equal(t, 1, bytes.Count(b, []byte(old)), "the suite changed: revisit the fix of %q", old)
		b = bytes.Replace(b, []byte(old), []byte(fixed), 1)
	}
	require.NoError(t, os.WriteFile(helpers, b, 0o644))

	bin := filepath.Join(tmp, "compliance-receiver.test")
	goCmd(src, "test", "-c", "-o", bin, "./receiver")
	return complianceSuite{dir: filepath.Join(src, "receiver"), bin: bin}
}
