package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// Credentials every receiver test uses. "other" is configured by digest only,
// as an operator who keeps no plaintext on disk would.
const (
	tokenAcme  = "s3cret"
	tokenOther = "0ther-t0ken"
)

// writeReceiverConfig writes tokens.yaml and receiver.yaml into dir and
// returns the config path. storageYAML is the indented body of `storage:`
// (may be empty), limitsYAML that of `limits:`.
func writeReceiverConfig(t *testing.T, dir, limitsYAML, storageYAML string) string {
	t.Helper()
	tokens := fmt.Sprintf("tokens:\n- token: %q\n  tenant: acme\n- token_sha256: %q\n  tenant: other\n",
		tokenAcme, sha256Hex(tokenOther))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokens), 0o600))
	cfg := "auth:\n  tokens_file: tokens.yaml\n"
	if limitsYAML != "" {
		cfg += "limits:\n" + limitsYAML
	}
	if storageYAML != "" {
		cfg += "storage:\n" + storageYAML
	}
	p := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(p, []byte(cfg), 0o600))
	return p
}

// startReceiver starts the receiver binary on a loopback port with cfgPath
// and storagePath and waits until it is ready.
func startReceiver(t *testing.T, cfgPath, storagePath string, extra ...string) *Process {
	t.Helper()
	args := append([]string{
		"--config.file=" + cfgPath,
		"--storage.path=" + storagePath,
		"--web.listen-address=127.0.0.1:0",
		"--log.format=json",
	}, extra...)
	p := startBinary(t, "receiver", args...)
	waitHTTP(t, p.URL()+"/-/ready", http.StatusOK)
	return p
}

// encodeWrite marshals and snappy-compresses a remote-write 1.0 request.
func encodeWrite(t testing.TB, req *prompb.WriteRequest) []byte {
	t.Helper()
	raw, err := req.Marshal()
	require.NoError(t, err)
	return snappy.Encode(nil, raw)
}

// postWrite sends body to base's write endpoint the way a remote-write 1.0
// client does; hdr overrides or (with an empty value) removes headers.
// It returns the status and the response body.
func postWrite(client *http.Client, base, token string, body []byte, hdr map[string]string) (int, string, error) {
	return postWriteTo(client, base+"/api/v1/write", token, body, hdr)
}

// postWriteTo is postWrite to any remote-write URL.
func postWriteTo(client *http.Client, url, token string, body []byte, hdr map[string]string) (int, string, error) {
	r, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	r.Header.Set("Content-Type", "application/x-protobuf")
	r.Header.Set("Content-Encoding", "snappy")
	r.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	resp, err := client.Do(r)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// mustWrite sends req and requires a 204.
func mustWrite(t *testing.T, base, token string, req *prompb.WriteRequest) {
	t.Helper()
	code, body, err := postWrite(http.DefaultClient, base, token, encodeWrite(t, req), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, code, "write: %s", body)
}

// apiResponse is the Prometheus HTTP API envelope.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
}

// apiGet calls a Prometheus HTTP API endpoint and returns the HTTP status
// and the decoded envelope (zero if the body is not JSON).
func apiGet(t *testing.T, base, token, path string, params url.Values) (int, apiResponse) {
	t.Helper()
	u := base + path
	if len(params) > 0 {
		u += "?" + params.Encode()
	}
	r, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(t, err)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out apiResponse
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

// apiData calls an endpoint, requires success, decodes data into v and
// returns the warnings.
func apiData(t *testing.T, base, token, path string, params url.Values, v any) []string {
	t.Helper()
	code, resp := apiGet(t, base, token, path, params)
	require.Equal(t, http.StatusOK, code, "%s %v: %s %s", path, params, resp.ErrorType, resp.Error)
	require.Equal(t, "success", resp.Status)
	require.NoError(t, json.Unmarshal(resp.Data, v), "%s: %s", path, resp.Data)
	return resp.Warnings
}

// appendPeers adds a peers section (the replica token file, a 5s timeout,
// and extra lines under peers:) to the receiver config at cfg.
func appendPeers(t *testing.T, cfg string, endpoints []string, replicaToken, extra string) {
	t.Helper()
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("peers:\n  endpoints: [" + strings.Join(endpoints, ", ") + "]\n  replica_token_file: " + replicaToken + "\n  timeout: 30s\n" + extra)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// queryResult is the data of /api/v1/query and query_range.
type queryResult struct {
	ResultType string       `json:"resultType"`
	Result     []promSeries `json:"result"`
}

// promSeries is one element of a vector or matrix result; values keep the
// API's [time, "value"] encoding so comparisons are exact.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  []json.RawMessage `json:"value,omitempty"`
	Values [][2]json.Number  `json:"values,omitempty"`
}

// instant runs an instant query at ts and returns the result.
func instant(t *testing.T, base, token, q string, ts time.Time) queryResult {
	t.Helper()
	var r queryResult
	apiData(t, base, token, "/api/v1/query", url.Values{"query": {q}, "time": {formatTime(ts)}}, &r)
	return r
}

// formatTime renders ts as the API's fractional Unix seconds, to the millisecond.
func formatTime(ts time.Time) string {
	return model.TimeFromUnixNano(ts.UnixNano()).String()
}

// scrapeMetrics fetches /metrics and parses it.
func scrapeMetrics(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return mfs
}

// metricValue returns the value of the counter or gauge name whose labels
// include want, or -1 if there is none.
func metricValue(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	mf, ok := mfs[name]
	if !ok {
		return -1
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Untyped != nil:
			return m.GetUntyped().GetValue()
		}
	}
	return -1
}

// labelsOf builds sorted prompb labels from alternating names and values.
func labelsOf(kv ...string) []prompb.Label {
	ls := make([]prompb.Label, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		ls = append(ls, prompb.Label{Name: kv[i], Value: kv[i+1]})
	}
	return ls
}

// printable reports whether s is short readable text, as error bodies must be.
func printable(s string) bool {
	if strings.TrimSpace(s) == "" || len(s) > 4096 {
		return false
	}
	for _, r := range s {
		if r != '\n' && r != '\t' && (r < 0x20 || r == 0x7f || r == '\uFFFD') {
			return false
		}
	}
	return true
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
