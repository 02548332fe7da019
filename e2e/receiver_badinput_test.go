package e2e

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestReceiverBadInput sends malformed and hostile requests to the real
// binary. Each gets its documented status and a short readable body, every
// refusal is counted on /metrics by code and reason, and valid writes keep
// working afterwards.
func TestReceiverBadInput(t *testing.T) {
	dir := t.TempDir()
	cfg := writeReceiverConfig(t, dir,
		"  defaults:\n    max_body_bytes: 64KiB\n    max_decoded_bytes: 1MiB\n    max_label_names_per_series: 8\n    max_label_name_length: 32\n    max_label_value_length: 64\n",
		"")
	rcv := startReceiver(t, cfg, filepath.Join(dir, "data"))

	now := time.Now()
	nowMs := now.UnixMilli()
	sample := []prompb.Sample{{Value: 1, Timestamp: nowMs}}
	series := func(ls ...prompb.Label) *prompb.WriteRequest {
		return &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Labels: ls, Samples: sample}}}
	}
	lbl := func(n, v string) prompb.Label { return prompb.Label{Name: n, Value: v} }
	valid := series(lbl("__name__", "bad_input_valid"), lbl("case", "first"))
	validBody := encodeWrite(t, valid)

	// A snappy block whose header declares 2 GiB, followed by a few literal bytes.
	hugeDecl := binary.AppendUvarint(nil, 2<<30)
	hugeDecl = append(hugeDecl, 0x08, 'a', 'b', 'c')

	tooManyLabels := []prompb.Label{lbl("__name__", "m")}
	for i := range 8 {
		tooManyLabels = append(tooManyLabels, lbl("l"+string(rune('a'+i)), "v"))
	}

	type tc struct {
		name   string
		token  string
		body   []byte
		hdr    map[string]string
		code   int
		reason string // phonehome_receive_rejected_samples_total reason, one sample each
		inBody string // a word the readable body must contain
	}
	cases := []tc{
		{name: "first valid write", token: tokenAcme, body: validBody, code: http.StatusNoContent},
		{name: "garbage body", token: tokenAcme, body: []byte("this is not snappy at all \xff\xfe"), code: 400, inBody: "snappy"},
		{name: "empty body", token: tokenAcme, body: nil, code: 400, inBody: "snappy"},
		{name: "truncated snappy", token: tokenAcme, body: validBody[:len(validBody)/2], code: 400, inBody: "snappy"},
		{name: "snappy of garbage protobuf", token: tokenAcme, body: snappy.Encode(nil, []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3}), code: 400, inBody: "protobuf"},
		{name: "huge declared decoded length", token: tokenAcme, body: hugeDecl, code: 413, inBody: "decoded"},
		{name: "oversized body", token: tokenAcme, body: bytes.Repeat([]byte("x"), 65<<10), code: 413, inBody: "limit"},
		{name: "wrong content type", token: tokenAcme, body: validBody, hdr: map[string]string{"Content-Type": "text/plain"}, code: 415, inBody: "content-type"},
		{name: "unknown proto message", token: tokenAcme, body: validBody, hdr: map[string]string{"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v9.Request"}, code: 415, inBody: "proto"},
		{name: "json content type", token: tokenAcme, body: []byte(`{"timeseries":[]}`), hdr: map[string]string{"Content-Type": "application/json", "Content-Encoding": ""}, code: 415, inBody: "content-type"},
		{name: "wrong encoding", token: tokenAcme, body: validBody, hdr: map[string]string{"Content-Encoding": "gzip"}, code: 415, inBody: "gzip"},
		{name: "no token", body: validBody, code: 401},
		{name: "wrong token", token: "not-a-token", body: validBody, code: 401},
		{name: "basic auth", body: validBody, hdr: map[string]string{"Authorization": "Basic YWNtZTpzM2NyZXQ="}, code: 401},
		{name: "token sha256 digest as token", token: sha256Hex(tokenOther), body: validBody, code: 401},
		{name: "too many labels", token: tokenAcme, body: encodeWrite(t, series(tooManyLabels...)), code: 400, reason: "label_limits", inBody: "labels"},
		{name: "too long value", token: tokenAcme, body: encodeWrite(t, series(lbl("__name__", "m"), lbl("a", strings.Repeat("v", 65)))), code: 400, reason: "label_limits", inBody: "limit"},
		{name: "too long name", token: tokenAcme, body: encodeWrite(t, series(lbl("__name__", "m"), lbl(strings.Repeat("n", 33), "v"))), code: 400, reason: "label_limits", inBody: "limit"},
		{name: "unsorted labels are sorted", token: tokenAcme, body: encodeWrite(t, series(lbl("__name__", "m"), lbl("b", "1"), lbl("a", "2"))), code: http.StatusNoContent},
		{name: "unsorted duplicate label", token: tokenAcme, body: encodeWrite(t, series(lbl("b", "1"), lbl("__name__", "m"), lbl("b", "2"))), code: 400, reason: "invalid_labels", inBody: "duplicate"},
		{name: "duplicate label", token: tokenAcme, body: encodeWrite(t, series(lbl("__name__", "m"), lbl("a", "1"), lbl("a", "2"))), code: 400, reason: "invalid_labels", inBody: "duplicate"},
		{name: "empty label name", token: tokenAcme, body: encodeWrite(t, series(lbl("", "x"), lbl("__name__", "m"))), code: 400, reason: "invalid_labels", inBody: "empty"},
		{name: "no metric name", token: tokenAcme, body: encodeWrite(t, series(lbl("job", "x"))), code: 400, reason: "invalid_labels", inBody: "__name__"},
		{name: "invalid label name", token: tokenAcme, body: encodeWrite(t, series(lbl("__name__", "m"), lbl("a-b", "x"))), code: 400, reason: "invalid_labels", inBody: "a-b"},
		{name: "invalid utf-8 value", token: tokenAcme, body: encodeWrite(t, series(lbl("__name__", "m"), lbl("a", "\xff\xfe"))), code: 400, reason: "invalid_labels", inBody: "UTF-8"},
		{name: "no samples", token: tokenAcme, body: encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Labels: labelsOf("__name__", "m")}}}), code: 400, reason: "no_samples", inBody: "no samples"},
		{name: "sample far in the future", token: tokenAcme, body: encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
			Labels: labelsOf("__name__", "bad_input_future"), Samples: []prompb.Sample{{Value: 1, Timestamp: now.Add(time.Hour).UnixMilli()}},
		}}}), code: 400, reason: "too_far_in_future", inBody: "rejected"},
		{name: "sample too old", token: tokenAcme, body: encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
			Labels: labelsOf("__name__", "bad_input_old"), Samples: []prompb.Sample{{Value: 1, Timestamp: now.Add(-30 * time.Hour).UnixMilli()}},
		}}}), code: 400, reason: "too_old", inBody: "rejected"},
		{name: "one bad series among good ones", token: tokenAcme, body: encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
			{Labels: labelsOf("__name__", "bad_input_valid", "case", "partial"), Samples: sample},
			{Labels: labelsOf("job", "nameless"), Samples: sample},
		}}), code: 400, reason: "invalid_labels", inBody: "1 of 2 samples rejected"},
		{name: "identical batch resent", token: tokenAcme, body: validBody, code: http.StatusNoContent},
	}

	wantCodes := map[int]int{}
	wantReasons := map[string]int{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body, err := postWrite(http.DefaultClient, rcv.URL(), c.token, c.body, c.hdr)
			require.NoError(t, err)
			require.Equal(t, c.code, code, "body: %q", body)
			if c.code == http.StatusNoContent {
				return
			}
			require.True(t, printable(body), "body is not short readable text: %q", body)
			require.Contains(t, body, c.inBody)
		})
		wantCodes[c.code]++
		if c.reason != "" {
			wantReasons[c.reason]++
		}
	}

	// A chunked body (no Content-Length) over the limit is cut off by the reader;
	// the struct hides the reader's type so net/http cannot learn its length.
	t.Run("oversized chunked body", func(t *testing.T) {
		r, err := http.NewRequest(http.MethodPost, rcv.URL()+"/api/v1/write", struct{ io.Reader }{bytes.NewReader(bytes.Repeat([]byte("y"), 200<<10))})
		require.NoError(t, err)
		r.ContentLength = -1
		r.Header.Set("Authorization", "Bearer "+tokenAcme)
		r.Header.Set("Content-Type", "application/x-protobuf")
		r.Header.Set("Content-Encoding", "snappy")
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	})
	wantCodes[413]++

	// The receiver still serves valid writes, and what was valid is stored.
	mustWrite(t, rcv.URL(), tokenAcme, series(lbl("__name__", "bad_input_valid"), lbl("case", "after")))
	wantCodes[204]++
	res := instant(t, rcv.URL(), tokenAcme, `bad_input_valid`, now.Add(time.Second))
	var got []string
	for _, s := range res.Result {
		got = append(got, s.Metric["case"])
	}
	require.ElementsMatch(t, []string{"first", "partial", "after"}, got)
	require.Empty(t, instant(t, rcv.URL(), tokenAcme, `{__name__=~"bad_input_future|bad_input_old"}`, now.Add(time.Second)).Result)
	// Of the series named m, only the one sent unsorted was repaired and stored.
	ms := instant(t, rcv.URL(), tokenAcme, `m`, now.Add(time.Second)).Result
	require.Len(t, ms, 1)
	require.Equal(t, "2", ms[0].Metric["a"])
	require.Equal(t, "1", ms[0].Metric["b"])

	// Every refusal is counted by code and reason.
	mfs := scrapeMetrics(t, rcv.URL())
	for code, n := range wantCodes {
		require.Equal(t, float64(n), metricValue(mfs, "phonehome_receive_requests_total", map[string]string{"handler": "/api/v1/write", "code": strconv.Itoa(code)}), "requests with code %d", code)
	}
	for _, reason := range []string{"invalid_labels", "label_limits", "no_samples", "too_far_in_future", "too_old"} {
		require.Equal(t, float64(wantReasons[reason]), metricValue(mfs, "phonehome_receive_rejected_samples_total", map[string]string{"reason": reason}), "rejected samples with reason %s", reason)
	}
	require.Equal(t, float64(wantCodes[401]), metricValue(mfs, "phonehome_receive_unauthenticated_requests_total", nil))
	require.Equal(t, float64(1), metricValue(mfs, "phonehome_receive_unsorted_series_total", nil))
	rcv.Stop()
}

// TestReceiverRefusesBadStartup checks the exits of the startup path: an
// invalid config exits 2 naming each YAML path, --check-config accepts a
// valid one, and the receiver will not run without authentication unless
// told to with --insecure.no-auth.
func TestReceiverRefusesBadStartup(t *testing.T) {
	dir := t.TempDir()
	run := func(t *testing.T, args ...string) (int, string) {
		t.Helper()
		var out bytes.Buffer
		cmd := exec.Command(filepath.Join(binDir, "receiver"), args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan error, 1)
		require.NoError(t, cmd.Start())
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return ee.ExitCode(), out.String()
			}
			require.NoError(t, err)
			return 0, out.String()
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			t.Fatalf("receiver %v did not exit within a minute (killed: %v): %s", args, <-done, out.String())
			return -1, ""
		}
	}

	valid := writeReceiverConfig(t, dir, "", "  external_labels: {replica: r0}\n")
	code, out := run(t, "--check-config", "--config.file="+valid)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "ok")

	invalid := filepath.Join(dir, "invalid.yaml")
	require.NoError(t, os.WriteFile(invalid, []byte(
		"auth:\n  tokens_file: tokens.yaml\nstorage:\n  block_duration: 90s\n  external_labels: {tenant_id: x}\n  bucket:\n    type: gcs\n"), 0o600))
	code, out = run(t, "--check-config", "--config.file="+invalid)
	require.Equal(t, 2, code, out)
	for _, path := range []string{invalid, "storage.block_duration", "storage.external_labels.tenant_id", "storage.bucket.type"} {
		require.Contains(t, out, path)
	}

	unknown := filepath.Join(dir, "unknown.yaml")
	require.NoError(t, os.WriteFile(unknown, []byte("auth:\n  tokens_file: tokens.yaml\nlimits:\n  defaults:\n    max_bodybytes: 1KiB\n"), 0o600))
	code, out = run(t, "--check-config", "--config.file="+unknown)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "max_bodybytes")

	badTokens := filepath.Join(dir, "badtokens.yaml")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens-bad.yaml"), []byte("tokens:\n- tenant: acme\n"), 0o600))
	require.NoError(t, os.WriteFile(badTokens, []byte("auth:\n  tokens_file: tokens-bad.yaml\n"), 0o600))
	code, out = run(t, "--check-config", "--config.file="+badTokens)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "tokens[0]")

	noAuth := filepath.Join(dir, "noauth.yaml")
	require.NoError(t, os.WriteFile(noAuth, []byte("storage:\n  ship_interval: 1m\n"), 0o600))
	code, out = run(t, "--config.file="+noAuth, "--storage.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:0")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "--insecure.no-auth")

	// With the flag it starts, and accepts writes without credentials.
	rcv := startReceiver(t, noAuth, filepath.Join(dir, "data"), "--insecure.no-auth")
	mustWrite(t, rcv.URL(), "", &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels: labelsOf("__name__", "no_auth_trial"), Samples: []prompb.Sample{{Value: 1, Timestamp: time.Now().UnixMilli()}},
	}}})
	rcv.Stop()
}
