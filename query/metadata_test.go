package query

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// fakeMetadata is a MetadataReader over fixed per-tenant metadata.
type fakeMetadata map[string]map[string][]metadata.Metadata

func (f fakeMetadata) Metadata(tenant, _ string, _ int) (map[string][]metadata.Metadata, error) {
	out := map[string][]metadata.Metadata{}
	for k, v := range f[tenant] {
		out[k] = v
	}
	return out, nil
}

func TestMetadataEndpoint(t *testing.T) {
	md := fakeMetadata{
		"acme": {
			"http_requests_total": {{Type: model.MetricTypeCounter, Help: "Requests.", Unit: ""}},
			"rpc_duration_seconds": {
				{Type: model.MetricTypeHistogram, Help: "RPC latency.", Unit: "seconds"},
				{Type: model.MetricTypeHistogram, Help: "RPC latency; v2.", Unit: "seconds"},
			},
		},
		"globex": {"secret_total": {{Type: model.MetricTypeCounter, Help: "Secret."}}},
	}
	h := NewHandler(discardLogger(), NewEngine(discardLogger(), nil, Options{}), tenantDBs{}, Options{Metadata: md})
	get := func(tenant string, form url.Values) (int, string) {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/metadata?"+form.Encode(), nil)
		r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: tenant}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code, rec.Body.String()
	}

	code, body := get("acme", url.Values{"metric": {"http_requests_total"}})
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"status":"success","data":{"http_requests_total":[{"type":"counter","help":"Requests.","unit":""}]}}`, body)

	code, body = get("acme", nil)
	require.Equal(t, http.StatusOK, code)
	var all struct {
		Status string                         `json:"status"`
		Data   map[string][]metadata.Metadata `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &all))
	for _, ms := range all.Data { // Prometheus builds each list from a set
		slices.SortFunc(ms, func(a, b metadata.Metadata) int { return strings.Compare(a.Help, b.Help) })
	}
	require.Equal(t, "success", all.Status)
	require.Equal(t, md["acme"], all.Data)

	_, body = get("acme", url.Values{"limit_per_metric": {"1"}, "metric": {"rpc_duration_seconds"}})
	require.Contains(t, body, `"rpc_duration_seconds":[{"type":"histogram"`)
	require.NotContains(t, body, `},{`, "one entry per metric")

	_, body = get("acme", url.Values{"limit": {"1"}})
	require.Contains(t, body, `"status":"success"`)
	require.Len(t, decodeData(t, body), 1)

	_, body = get("globex", nil)
	require.JSONEq(t, `{"status":"success","data":{"secret_total":[{"type":"counter","help":"Secret.","unit":""}]}}`, body)

	_, body = get("nobody", nil)
	require.JSONEq(t, `{"status":"success","data":{}}`, body)

	code, body = get("acme", url.Values{"limit": {"x"}})
	require.Equal(t, http.StatusBadRequest, code)
	require.JSONEq(t, `{"status":"error","errorType":"bad_data","error":"limit must be a number"}`, body)
}

func decodeData(t *testing.T, body string) map[string]any {
	t.Helper()
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	return v["data"].(map[string]any)
}
