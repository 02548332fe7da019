package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReceiverMatchesPrometheus has Debian's Prometheus scrape itself every
// second and remote-write everything to the receiver with a bearer token.
// The same PromQL queries, at a fixed time whose data both have, return the
// same series and values from both. Reads are scoped to the token's tenant.
func TestReceiverMatchesPrometheus(t *testing.T) {
	dir := t.TempDir()
	rcv := startReceiver(t, writeReceiverConfig(t, dir, "", ""), filepath.Join(dir, "data"))

	promAddr := freeAddr(t)
	// One shard keeps the sent order equal to the WAL order, so "the receiver
	// has up at T" implies "the receiver has every sample scraped before T".
	prom := startPrometheusAt(t, promAddr, fmt.Sprintf(`
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
- job_name: prometheus
  static_configs: [{targets: [%q]}]
remote_write:
- url: %s/api/v1/write
  authorization: {credentials: %s}
  queue_config: {min_shards: 1, max_shards: 1, batch_send_deadline: 100ms, min_backoff: 10ms, max_backoff: 200ms}
`, promAddr, rcv.URL(), tokenAcme))

	// Wait for 20 s of self-scrapes in the receiver, then pick an evaluation
	// time T0 between two scrapes, 2.5 s before the newest one: PromQL of
	// Prometheus 2.x (closed ranges) and 3.x (left-open ranges) then agree,
	// and all data at or before T0 is in both.
	var upTimes []int64
	eventually(t, 90*time.Second, func() error {
		upTimes = sampleTimes(t, rcv.URL(), tokenAcme, `up[1h]`, time.Now())
		if n := len(upTimes); n < 2 || upTimes[n-1]-upTimes[0] < 20_000 {
			return fmt.Errorf("receiver has %d samples of up", n)
		}
		return nil
	})
	first, last := upTimes[0], upTimes[len(upTimes)-1]
	t0 := time.UnixMilli(last - 2500)
	start := t0.Add(-10 * time.Second)
	require.Greater(t, start.UnixMilli()-5000, first, "range windows must start after the first sample sent")

	at := url.Values{"time": {formatTime(t0)}}
	rng := url.Values{"start": {formatTime(start)}, "end": {formatTime(t0)}, "step": {"1"}}
	span := url.Values{"start": {formatTime(start)}, "end": {formatTime(t0)}}
	with := func(v url.Values, kv ...string) url.Values {
		out := url.Values{}
		for k, vs := range v {
			out[k] = vs
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	// Results must be equal: deterministic functions of the data up to T0.
	exact := []struct {
		path   string
		params url.Values
	}{
		{"/api/v1/query", with(at, "query", `up`)},
		{"/api/v1/query", with(at, "query", `count by (job) (up)`)},
		{"/api/v1/query", with(at, "query", `sum(prometheus_tsdb_head_series)`)},
		{"/api/v1/query", with(at, "query", `rate(prometheus_http_requests_total[5s])`)},
		{"/api/v1/query", with(at, "query", `histogram_quantile(0.9, sum by (le) (rate(prometheus_http_request_duration_seconds_bucket[5s])))`)},
		{"/api/v1/query", with(at, "query", `prometheus_build_info`)},
		{"/api/v1/query", with(at, "query", `{__name__=~".+"}`)}, // every series, every value at T0
		{"/api/v1/query", with(at, "query", `scrape_samples_scraped[10s]`)},
		{"/api/v1/query_range", with(rng, "query", `up`)},
		{"/api/v1/query_range", with(rng, "query", `scrape_duration_seconds`)},
		{"/api/v1/query_range", with(rng, "query", `rate(prometheus_http_requests_total[5s])`)},
		{"/api/v1/series", with(span, "match[]", `up`, "match[]", `prometheus_build_info`, "match[]", `{__name__=~"prometheus_tsdb_head_.*"}`)},
		{"/api/v1/labels", with(span, "match[]", `up`)},
		{"/api/v1/label/job/values", span},
	}
	// Results from the whole head: the receiver has everything Prometheus had
	// before the receiver was asked, and nothing Prometheus lacked after it.
	sandwiched := []struct {
		path   string
		params url.Values
	}{
		{"/api/v1/series", with(span, "match[]", `{__name__=~".+"}`)},
		{"/api/v1/labels", span},
		{"/api/v1/label/__name__/values", span},
	}

	fromProm := make([]json.RawMessage, len(exact))
	for i, q := range exact {
		fromProm[i] = rawData(t, prom.URL(), "", q.path, q.params)
		require.NotRegexp(t, `^(\[\]|\{"resultType":"\w+","result":\[\]\})$`, string(fromProm[i]), "Prometheus has no data for %s %v", q.path, q.params)
	}
	before := make([][]string, len(sandwiched))
	for i, q := range sandwiched {
		before[i] = asSet(t, rawData(t, prom.URL(), "", q.path, q.params))
	}
	// Let the receiver catch up with everything Prometheus held when asked.
	asked := time.Now().UnixMilli()
	eventually(t, time.Minute, func() error {
		ts := sampleTimes(t, rcv.URL(), tokenAcme, `up[1m]`, time.Now())
		if len(ts) == 0 || ts[len(ts)-1] < asked+1000 {
			return fmt.Errorf("receiver's newest up is older than %d", asked+1000)
		}
		return nil
	})
	for i, q := range exact {
		got := rawData(t, rcv.URL(), tokenAcme, q.path, q.params)
		require.Equal(t, normalize(t, fromProm[i]), normalize(t, got), "%s %v", q.path, q.params)
		// Where the order is defined (matrices are sorted by labels, a
		// single series has one order), the bytes are Prometheus' too.
		var r queryResult
		if json.Unmarshal(got, &r) == nil && (r.ResultType == "matrix" || len(r.Result) == 1) {
			require.Equal(t, string(fromProm[i]), string(got), "%s %v: same values, different bytes", q.path, q.params)
		}
	}
	got := make([][]string, len(sandwiched))
	for i, q := range sandwiched {
		got[i] = asSet(t, rawData(t, rcv.URL(), tokenAcme, q.path, q.params))
	}
	for i, q := range sandwiched {
		after := asSet(t, rawData(t, prom.URL(), "", q.path, q.params))
		require.NotEmpty(t, before[i])
		require.Subset(t, got[i], before[i], "receiver lacks what Prometheus had: %s %v", q.path, q.params)
		require.Subset(t, after, got[i], "receiver has what Prometheus never had: %s %v", q.path, q.params)
	}

	// POST form queries answer the same as GET.
	form := with(at, "query", `count by (job) (up)`)
	resp, err := postForm(rcv.URL()+"/api/v1/query", tokenAcme, form)
	require.NoError(t, err)
	require.Equal(t, normalize(t, fromProm[1]), normalize(t, resp))

	// Responses are gzipped for clients that ask, as Prometheus' are.
	gz, err := http.NewRequest(http.MethodGet, rcv.URL()+"/api/v1/query?"+with(at, "query", "up").Encode(), nil)
	require.NoError(t, err)
	gz.Header.Set("Authorization", "Bearer "+tokenAcme)
	gz.Header.Set("Accept-Encoding", "gzip")
	gzResp, err := http.DefaultTransport.RoundTrip(gz)
	require.NoError(t, err)
	_ = gzResp.Body.Close()
	require.Equal(t, http.StatusOK, gzResp.StatusCode)
	require.Equal(t, "gzip", gzResp.Header.Get("Content-Encoding"))
	var build map[string]any
	apiData(t, rcv.URL(), tokenAcme, "/api/v1/status/buildinfo", nil, &build)
	require.Equal(t, "0.1.0", build["version"], "a build that names no version (internal/buildversion)")
	require.NotEmpty(t, build["revision"])

	// Another tenant sees nothing of acme's; no or a wrong token sees nothing at all.
	var empty queryResult
	apiData(t, rcv.URL(), tokenOther, "/api/v1/query", with(at, "query", `{__name__=~".+"}`), &empty)
	require.Empty(t, empty.Result)
	for _, p := range []string{"/api/v1/series", "/api/v1/label/__name__/values"} {
		var list []json.RawMessage
		apiData(t, rcv.URL(), tokenOther, p, with(span, "match[]", `{__name__=~".+"}`), &list)
		require.Empty(t, list, p)
	}
	var names []string
	apiData(t, rcv.URL(), tokenOther, "/api/v1/labels", span, &names)
	require.Empty(t, names)
	for _, token := range []string{"", "wrong", sha256Hex(tokenOther)} {
		code, _ := apiGet(t, rcv.URL(), token, "/api/v1/query", with(at, "query", `up`))
		require.Equal(t, http.StatusUnauthorized, code, "token %q", token)
		code, _ = apiGet(t, rcv.URL(), token, "/api/v1/labels", nil)
		require.Equal(t, http.StatusUnauthorized, code, "token %q", token)
	}

	// Prometheus' sends were all accepted.
	mfs := scrapeMetrics(t, rcv.URL())
	require.Positive(t, metricValue(mfs, "phonehome_receive_requests_total", map[string]string{"code": "204"}))
	for _, code := range []string{"400", "401", "413", "415", "500", "503"} {
		require.LessOrEqual(t, metricValue(mfs, "phonehome_receive_requests_total", map[string]string{"code": code}), 0.0, "requests with code %s", code)
	}
	prom.Stop() // first, so its remote write does not retry against a stopped receiver
	rcv.Stop()
}

// sampleTimes runs a range-vector query at ts and returns the sample
// timestamps (ms) of its first series, oldest first.
func sampleTimes(t *testing.T, base, token, q string, ts time.Time) []int64 {
	t.Helper()
	r := instant(t, base, token, q, ts)
	if len(r.Result) == 0 {
		return nil
	}
	out := make([]int64, 0, len(r.Result[0].Values))
	for _, v := range r.Result[0].Values {
		out = append(out, parseAPITime(t, v[0]))
	}
	return out
}

// parseAPITime converts the API's fractional-seconds timestamp to ms.
func parseAPITime(t *testing.T, raw json.Number) int64 {
	t.Helper()
	f, err := raw.Float64()
	require.NoError(t, err)
	return int64(f*1000 + 0.5)
}

// rawData returns the data of a successful API call.
func rawData(t *testing.T, base, token, path string, params url.Values) json.RawMessage {
	t.Helper()
	code, resp := apiGet(t, base, token, path, params)
	require.Equal(t, http.StatusOK, code, "%s%s %v: %s", base, path, params, resp.Error)
	require.Equal(t, "success", resp.Status)
	return resp.Data
}

// normalize decodes data and sorts every list whose order is not part of
// the API contract (instant vectors, series and label lists).
func normalize(t *testing.T, data json.RawMessage) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(data, &v))
	switch d := v.(type) {
	case []any:
		sortAny(d)
	case map[string]any:
		if res, ok := d["result"].([]any); ok {
			sortAny(res)
		}
	}
	return v
}

func sortAny(list []any) {
	sort.Slice(list, func(i, j int) bool {
		bi, _ := json.Marshal(list[i]) // maps marshal with sorted keys
		bj, _ := json.Marshal(list[j])
		return string(bi) < string(bj)
	})
}

// asSet renders a list of strings or label sets as sorted canonical strings.
func asSet(t *testing.T, data json.RawMessage) []string {
	t.Helper()
	var list []any
	require.NoError(t, json.Unmarshal(data, &list))
	out := make([]string, 0, len(list))
	for _, e := range list {
		b, err := json.Marshal(e)
		require.NoError(t, err)
		out = append(out, string(b))
	}
	slices.Sort(out)
	return out
}

// postForm sends an API query as a POST form and returns its data.
func postForm(u, token string, form url.Values) (json.RawMessage, error) {
	r, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST %s: %d %s", u, resp.StatusCode, out.Error)
	}
	return out.Data, nil
}
