package e2e

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSeriesAcrossReplicas: /api/v1/series on one replica lists the series
// written to its peer, per tenant, with the API's match[], range and limit,
// from the peer's index: no remote read reaches the peer, so none of its
// samples is read. A peer that is down makes the answer partial (a
// warning), not a failure.
func TestSeriesAcrossReplicas(t *testing.T) {
	a, b, proxyAddr, asked := startRecordedReplicas(t)

	now := writeAcrossReplicas(t, a, b, asked)

	around := url.Values{"start": {formatTime(now.Add(-time.Hour))}, "end": {formatTime(now.Add(time.Minute))}}
	csv := func(id, name string) map[string]string {
		return map[string]string{"__name__": "csv_succeeded", "_id": id, "name": name}
	}
	got, ws := seriesCall(t, b, tokenAcme, withParams(around, "match[]", "csv_succeeded"))
	require.Empty(t, ws)
	require.Equal(t, []map[string]string{csv("c1", "install"), csv("c1", "upgrade"), csv("c2", "backup")}, got,
		"b lists a's series, never another tenant's")
	got, _ = seriesCall(t, b, tokenAcme, withParams(around, "match[]", "csv_succeeded", "match[]", `{channel="stable"}`))
	require.Equal(t, []map[string]string{
		{"__name__": "cluster_version", "_id": "c1", "channel": "stable"},
		csv("c1", "install"), csv("c1", "upgrade"), csv("c2", "backup"),
	}, got, "several match[], merged in label order")
	got, ws = seriesCall(t, b, tokenAcme, withParams(around, "match[]", "csv_succeeded", "limit", "2"))
	require.Equal(t, []map[string]string{csv("c1", "install"), csv("c1", "upgrade")}, got)
	require.Equal(t, []string{"results truncated due to limit"}, ws)
	got, _ = seriesCall(t, b, tokenAcme, url.Values{"match[]": {"csv_succeeded"},
		"start": {formatTime(now.Add(-2 * time.Hour))}, "end": {formatTime(now.Add(-time.Hour))}})
	require.Empty(t, got, "the range applies on the peer")
	got, _ = seriesCall(t, b, tokenOther, withParams(around, "match[]", `{name!=""}`))
	require.Equal(t, []map[string]string{{"__name__": "secret_level", "_id": "c9", "name": "classified"}}, got)

	calls := asked()
	require.NotEmpty(t, calls)
	for _, c := range calls {
		require.Equal(t, "POST /api/v1/series", c, "b asked a's index for series (a form: match[] may be large), read none: %v", calls)
	}
	mfs := scrapeMetrics(t, b.URL())
	require.Zero(t, metricValue(mfs, "phonehome_peers_label_calls_total", map[string]string{"call": "series", "via": "series"}))
	require.GreaterOrEqual(t, metricValue(mfs, "phonehome_peers_label_calls_total", map[string]string{"call": "series", "via": "labels"}), float64(len(calls)))

	a.Kill()
	got, ws = seriesCall(t, b, tokenAcme, withParams(around, "match[]", "csv_succeeded"))
	require.Equal(t, []map[string]string{csv("c2", "backup")}, got)
	require.Len(t, ws, 1)
	require.Contains(t, ws[0], "peer "+proxyAddr+" unavailable, its data is missing")
}

// seriesCall calls /api/v1/series, requires success and returns its data
// and warnings.
func seriesCall(t *testing.T, p *Process, token string, params url.Values) ([]map[string]string, []string) {
	t.Helper()
	var data []map[string]string
	ws := apiData(t, p.URL(), token, "/api/v1/series", params, &data)
	return data, ws
}
