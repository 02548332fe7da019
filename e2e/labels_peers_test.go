package e2e

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestLabelCallsAcrossReplicas: label names and values of series written
// to one replica are listed by its peer, per tenant, with the API's
// matchers, range and limit, without reading the first replica's series
// (no remote read reaches it); a peer that is down makes the answer
// partial (a warning), not a failure.
func TestLabelCallsAcrossReplicas(t *testing.T) {
	a, b, proxyAddr, asked := startRecordedReplicas(t)

	now := writeAcrossReplicas(t, a, b, asked)

	around := url.Values{"start": {formatTime(now.Add(-time.Hour))}, "end": {formatTime(now.Add(time.Minute))}}
	// label_values(csv_succeeded, name), as a Grafana template variable asks.
	got, ws := labelCall(t, b, tokenAcme, "/api/v1/label/name/values", withParams(around, "match[]", "csv_succeeded"))
	require.Empty(t, ws)
	require.Equal(t, []string{"backup", "install", "upgrade"}, got, "b lists a's values, never another tenant's")
	got, ws = labelCall(t, b, tokenAcme, "/api/v1/labels", around)
	require.Empty(t, ws)
	require.Equal(t, []string{"__name__", "_id", "channel", "name"}, got)
	got, _ = labelCall(t, b, tokenAcme, "/api/v1/labels", withParams(around, "match[]", "cluster_version"))
	require.Equal(t, []string{"__name__", "_id", "channel"}, got)
	got, ws = labelCall(t, b, tokenAcme, "/api/v1/label/name/values", withParams(around, "limit", "2"))
	require.Equal(t, []string{"backup", "install"}, got)
	require.Equal(t, []string{"results truncated due to limit"}, ws)
	got, _ = labelCall(t, b, tokenAcme, "/api/v1/label/name/values",
		url.Values{"start": {formatTime(now.Add(-2 * time.Hour))}, "end": {formatTime(now.Add(-time.Hour))}})
	require.Empty(t, got, "the range applies on the peer")
	got, _ = labelCall(t, b, tokenOther, "/api/v1/label/name/values", around)
	require.Equal(t, []string{"classified"}, got)
	got, _ = labelCall(t, b, tokenOther, "/api/v1/labels", around)
	require.Equal(t, []string{"__name__", "_id", "name"}, got)

	calls := asked()
	require.NotEmpty(t, calls)
	for _, c := range calls {
		// Names as a form (match[] may be large), values on GET (the only method Prometheus serves them on).
		require.True(t, c == "POST /api/v1/labels" || strings.HasPrefix(c, "GET /api/v1/label/"), "b asked a only for labels, read no series: %v", calls)
	}
	mfs := scrapeMetrics(t, b.URL())
	require.Zero(t, metricValue(mfs, "phonehome_peers_label_calls_total", map[string]string{"call": "labels", "via": "series"}))
	// Each of a's answers, and b's own first (before it knew itself).
	require.GreaterOrEqual(t, metricValue(mfs, "phonehome_peers_label_calls_total", map[string]string{"call": "labels", "via": "labels"}), float64(len(calls)))

	a.Kill()
	got, ws = labelCall(t, b, tokenAcme, "/api/v1/label/name/values", withParams(around, "match[]", "csv_succeeded"))
	require.Equal(t, []string{"backup"}, got)
	require.Len(t, ws, 1)
	require.Contains(t, ws[0], "peer "+proxyAddr+" unavailable, its data is missing")
}

// labelCall calls a label endpoint, requires success and returns its data
// and warnings.
func labelCall(t *testing.T, p *Process, token, path string, params url.Values) ([]string, []string) {
	t.Helper()
	var data []string
	ws := apiData(t, p.URL(), token, path, params, &data)
	return data, ws
}

// startRecordedReplicas starts two replicas, a and b, peers of each other
// with a replica token (pushdown off), where b reaches a through a proxy at
// proxyAddr that records what b asks of it: asked returns the requests
// ("METHOD /path") since its last call.
func startRecordedReplicas(t *testing.T) (a, b *Process, proxyAddr string, asked func() []string) {
	t.Helper()
	dir := t.TempDir()
	replicaToken := filepath.Join(dir, "replica-token")
	require.NoError(t, os.WriteFile(replicaToken, []byte("r3plica-t0ken\n"), 0o600))
	aAddr, bAddr := freeAddr(t), freeAddr(t)

	var (
		mu   sync.Mutex
		seen []string
	)
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: aAddr})
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	asked = func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := seen
		seen = nil
		return out
	}
	proxyAddr = strings.TrimPrefix(proxy.URL, "http://")

	start := func(name, addr string, peers ...string) *Process {
		rdir := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(rdir, 0o755))
		cfg := writeReceiverConfig(t, rdir, "", "")
		appendPeers(t, cfg, peers, replicaToken, "  pushdown: false\n")
		return startReceiver(t, cfg, filepath.Join(rdir, "data"), "--web.listen-address="+addr)
	}
	a = start("a", aAddr, aAddr, bAddr)
	b = start("b", bAddr, proxyAddr, bAddr) // itself included, as a headless Service lists it
	return a, b, proxyAddr, asked
}

// writeNow writes one sample at now of each series to p as tenant token.
// writeAcrossReplicas writes, now, acme's cluster c1 (csv_succeeded
// install and upgrade, cluster_version) and other's c9 to a, and acme's c2
// (csv_succeeded backup) to b, then forgets what b asked of a meanwhile
// (its rules, its status page), and returns now.
func writeAcrossReplicas(t *testing.T, a, b *Process, asked func() []string) time.Time {
	t.Helper()
	now := time.Now()
	writeNow(t, a, tokenAcme, now,
		labelsOf("__name__", "csv_succeeded", "_id", "c1", "name", "install"),
		labelsOf("__name__", "csv_succeeded", "_id", "c1", "name", "upgrade"),
		labelsOf("__name__", "cluster_version", "_id", "c1", "channel", "stable"))
	writeNow(t, a, tokenOther, now, labelsOf("__name__", "secret_level", "_id", "c9", "name", "classified"))
	writeNow(t, b, tokenAcme, now, labelsOf("__name__", "csv_succeeded", "_id", "c2", "name", "backup"))
	asked()
	return now
}

func writeNow(t *testing.T, p *Process, token string, now time.Time, series ...[]prompb.Label) {
	t.Helper()
	req := &prompb.WriteRequest{}
	for _, ls := range series {
		req.Timeseries = append(req.Timeseries, prompb.TimeSeries{Labels: ls, Samples: []prompb.Sample{{Timestamp: now.UnixMilli(), Value: 1}}})
	}
	mustWrite(t, p.URL(), token, req)
}

// withParams returns a copy of base with the pairs kv added.
func withParams(base url.Values, kv ...string) url.Values {
	v := url.Values{}
	for k, vs := range base {
		v[k] = vs
	}
	for i := 0; i < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return v
}
