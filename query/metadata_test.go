package query

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// fakeMetadata is a MetadataIndex over fixed per-tenant metadata.
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
	h := NewHandler(discardLogger(), NewEngine(discardLogger(), nil, Options{}), tenantDBs{}, Options{Metadata: LocalMetadata(md)})
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

func TestMergeMetadata(t *testing.T) {
	var (
		c1 = metadata.Metadata{Type: model.MetricTypeCounter, Help: "Requests."}
		c2 = metadata.Metadata{Type: model.MetricTypeCounter, Help: "Requests served."}
		g  = metadata.Metadata{Type: model.MetricTypeGauge, Help: "Up.", Unit: ""}
		h  = metadata.Metadata{Type: model.MetricTypeHistogram, Help: "Latency.", Unit: "seconds"}
	)
	a := map[string][]metadata.Metadata{"requests_total": {c1}, "up": {g}}
	b := map[string][]metadata.Metadata{"requests_total": {c1, c2}, "latency_seconds": {h}}
	all := MetadataQuery{Limit: -1, LimitPerMetric: -1}
	for _, tc := range []struct {
		name string
		q    MetadataQuery
		want map[string][]metadata.Metadata
	}{
		{"union, each metadata once, first answer first", all, map[string][]metadata.Metadata{
			"requests_total": {c1, c2}, "up": {g}, "latency_seconds": {h},
		}},
		{"one metric", MetadataQuery{Metric: "requests_total", Limit: -1}, map[string][]metadata.Metadata{"requests_total": {c1, c2}}},
		{"an unknown metric", MetadataQuery{Metric: "nope", Limit: -1}, map[string][]metadata.Metadata{}},
		{"limit_per_metric", MetadataQuery{Limit: -1, LimitPerMetric: 1}, map[string][]metadata.Metadata{
			"requests_total": {c1}, "up": {g}, "latency_seconds": {h},
		}},
		{"limit keeps the first families by name", MetadataQuery{Limit: 2}, map[string][]metadata.Metadata{
			"latency_seconds": {h}, "requests_total": {c1, c2},
		}},
		{"limit 0 is none, as in Prometheus", MetadataQuery{Limit: 0}, map[string][]metadata.Metadata{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, MergeMetadata(tc.q, a, b))
		})
	}

	// A limit applied by every replica, then to their merge, is the limit
	// over the union: what makes asking each peer for q exact.
	for limit := range 4 {
		q := MetadataQuery{Limit: limit}
		require.Equal(t, MergeMetadata(q, a, b), MergeMetadata(q, MergeMetadata(q, a), MergeMetadata(q, b)), "limit %d", limit)
	}
	require.Empty(t, MergeMetadata(all), "no answers")
}

// partialMetadata answers with fixed data and a warning, or fails.
type partialMetadata struct {
	data map[string][]metadata.Metadata
	warn string
	err  error
}

func (p partialMetadata) Metadata(_ context.Context, _ string, q MetadataQuery) (map[string][]metadata.Metadata, annotations.Annotations, error) {
	var ws annotations.Annotations
	if p.warn != "" {
		ws.Add(errors.New(p.warn))
	}
	return MergeMetadata(q, p.data), ws, p.err
}

func TestMetadataHandlerWarnsAndFails(t *testing.T) {
	get := func(r MetadataReader, id *auth.Identity) (int, string) {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/metadata", nil)
		if id != nil {
			req = req.WithContext(auth.WithIdentity(req.Context(), *id))
		}
		rec := httptest.NewRecorder()
		NewMetadataHandler(r, nil).ServeHTTP(rec, req)
		require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		return rec.Code, rec.Body.String()
	}
	acme := &auth.Identity{Tenant: "acme"}
	up := map[string][]metadata.Metadata{"up": {{Type: model.MetricTypeGauge, Help: "Up."}}}

	code, body := get(partialMetadata{data: up, warn: "peer p1 unavailable, its metadata is missing"}, acme)
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"status":"success","data":{"up":[{"type":"gauge","help":"Up.","unit":""}]},"warnings":["peer p1 unavailable, its metadata is missing"]}`, body)

	code, body = get(partialMetadata{err: errors.New("storage not ready")}, acme)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.JSONEq(t, `{"status":"error","errorType":"unavailable","error":"storage not ready"}`, body)

	code, _ = get(partialMetadata{data: up}, nil)
	require.Equal(t, http.StatusInternalServerError, code, "no tenant is a wiring bug, never everyone's metadata")
}
