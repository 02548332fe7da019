package e2e

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"
)

// TestMetadataAcrossReplicas: metric metadata written to one replica is
// served by /api/v1/metadata on its peer, per tenant, with the API's
// parameters; a peer that is down makes the answer partial (a warning), not
// a failure.
func TestMetadataAcrossReplicas(t *testing.T) {
	dir := t.TempDir()
	replicaToken := filepath.Join(dir, "replica-token")
	require.NoError(t, os.WriteFile(replicaToken, []byte("r3plica-t0ken\n"), 0o600))
	// Each lists both, itself included, as a headless Service does.
	addrs := []string{freeAddr(t), freeAddr(t)}
	var replicas []*Process
	for i, name := range []string{"a", "b"} {
		rdir := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(rdir, 0o755))
		cfg := writeReceiverConfig(t, rdir, "", "")
		appendPeers(t, cfg, addrs, replicaToken, "")
		replicas = append(replicas, startReceiver(t, cfg, filepath.Join(rdir, "data"), "--web.listen-address="+addrs[i]))
	}
	a, b := replicas[0], replicas[1]

	var (
		served   = metadata.Metadata{Type: model.MetricTypeCounter, Help: "Requests served."}
		requests = metadata.Metadata{Type: model.MetricTypeCounter, Help: "Requests."}
		latency  = metadata.Metadata{Type: model.MetricTypeHistogram, Help: "RPC latency.", Unit: "seconds"}
		up       = metadata.Metadata{Type: model.MetricTypeGauge, Help: "Up."}
		secret   = metadata.Metadata{Type: model.MetricTypeGauge, Help: "Secret."}
	)
	writeMetadata(t, a, tokenAcme, map[string]metadata.Metadata{"http_requests_total": served, "rpc_duration_seconds_count": latency})
	writeMetadata(t, b, tokenAcme, map[string]metadata.Metadata{"http_requests_total": requests, "up": up})
	writeMetadata(t, a, tokenOther, map[string]metadata.Metadata{"secret_level": secret})

	md, ws := getMetadata(t, b, tokenAcme, nil)
	require.Empty(t, ws)
	require.Equal(t, map[string][]metadata.Metadata{
		"http_requests_total":  {requests, served}, // its own first, then its peer's
		"rpc_duration_seconds": {latency},
		"up":                   {up},
	}, md, "b serves a's metadata, never another tenant's")
	md, _ = getMetadata(t, a, tokenAcme, nil)
	require.Equal(t, []metadata.Metadata{served, requests}, md["http_requests_total"], "and a b's")

	md, _ = getMetadata(t, b, tokenOther, nil)
	require.Equal(t, map[string][]metadata.Metadata{"secret_level": {secret}}, md)

	md, _ = getMetadata(t, b, tokenAcme, url.Values{"metric": {"rpc_duration_seconds"}})
	require.Equal(t, map[string][]metadata.Metadata{"rpc_duration_seconds": {latency}}, md)
	md, _ = getMetadata(t, b, tokenAcme, url.Values{"limit": {"2"}, "limit_per_metric": {"1"}})
	require.Equal(t, map[string][]metadata.Metadata{"http_requests_total": {requests}, "rpc_duration_seconds": {latency}}, md)

	a.Kill()
	md, ws = getMetadata(t, b, tokenAcme, nil)
	require.Equal(t, map[string][]metadata.Metadata{"http_requests_total": {requests}, "up": {up}}, md)
	require.Len(t, ws, 1)
	require.Contains(t, ws[0], "peer "+a.Addr+" unavailable, its metadata is missing")
}

// writeMetadata writes one sample per series name, each with its
// metadata, as remote-write 2.0.
func writeMetadata(t *testing.T, p *Process, token string, byName map[string]metadata.Metadata) {
	t.Helper()
	st := writev2.NewSymbolTable()
	req := &writev2.Request{}
	for name, m := range byName {
		typ := map[model.MetricType]writev2.Metadata_MetricType{
			model.MetricTypeCounter: writev2.Metadata_METRIC_TYPE_COUNTER, model.MetricTypeGauge: writev2.Metadata_METRIC_TYPE_GAUGE,
			model.MetricTypeHistogram: writev2.Metadata_METRIC_TYPE_HISTOGRAM,
		}[m.Type]
		req.Timeseries = append(req.Timeseries, writev2.TimeSeries{
			LabelsRefs: st.SymbolizeLabels(labels.FromStrings("__name__", name, "job", "api"), nil),
			Samples:    []writev2.Sample{{Value: 1, Timestamp: time.Now().UnixMilli()}},
			Metadata:   writev2.Metadata{Type: typ, HelpRef: st.Symbolize(m.Help), UnitRef: st.Symbolize(m.Unit)},
		})
	}
	req.Symbols = st.Symbols()
	code, body, _ := postWriteV2(t, p.URL(), token, req)
	require.Equal(t, http.StatusNoContent, code, body)
}

// getMetadata calls /api/v1/metadata, requires success and returns its data
// and warnings.
func getMetadata(t *testing.T, p *Process, token string, params url.Values) (map[string][]metadata.Metadata, []string) {
	t.Helper()
	var data map[string][]metadata.Metadata
	ws := apiData(t, p.URL(), token, "/api/v1/metadata", params, &data)
	return data, ws
}
