package query

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// tenantDBs is a Reader over one in-test TSDB per tenant.
type tenantDBs map[string]*tsdb.DB

func (t tenantDBs) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	db, ok := t[tenant]
	if !ok {
		return promstorage.NoopQuerier(), nil
	}
	return db.Querier(mint, maxt)
}

func openDB(t *testing.T, series map[string]float64) *tsdb.DB {
	t.Helper()
	db, err := tsdb.Open(t.TempDir(), nil, nil, tsdb.DefaultOptions(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	app := db.Appender(context.Background())
	for job, v := range series {
		_, err := app.Append(0, labels.FromStrings("__name__", "up", "job", job), 1_000_000, v)
		require.NoError(t, err)
	}
	require.NoError(t, app.Commit())
	return db
}

func TestAPIIsTenantScoped(t *testing.T) {
	dbs := tenantDBs{
		"acme":   openDB(t, map[string]float64{"a": 1, "b": 0}),
		"globex": openDB(t, map[string]float64{"secret": 42}),
	}
	h := NewHandler(discardLogger(), NewEngine(discardLogger(), nil, Options{}), dbs, Options{Version: "test"})

	get := func(tenant, path string, form url.Values) (int, map[string]any) {
		r := httptest.NewRequest(http.MethodGet, path+"?"+form.Encode(), nil)
		if tenant != "" {
			r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: tenant}))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		var body map[string]any
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
		return rec.Code, body
	}

	code, body := get("acme", "/api/v1/query", url.Values{"query": {"sum(up)"}, "time": {"1000"}})
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "1", body["data"].(map[string]any)["result"].([]any)[0].(map[string]any)["value"].([]any)[1])

	_, body = get("acme", "/api/v1/label/job/values", nil)
	require.ElementsMatch(t, []any{"a", "b"}, body["data"], "another tenant's values never show")

	_, body = get("globex", "/api/v1/series", url.Values{"match[]": {"up"}})
	require.Len(t, body["data"], 1)

	_, body = get("nobody", "/api/v1/query", url.Values{"query": {"up"}, "time": {"1000"}})
	require.Empty(t, body["data"].(map[string]any)["result"])

	code, _ = get("", "/api/v1/query", url.Values{"query": {"up"}, "time": {"1000"}})
	require.Equal(t, http.StatusUnprocessableEntity, code, "no tenant in context is an execution error, never another tenant's data")

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/status/config", nil))
	require.Equal(t, http.StatusNotFound, rec.Code, "endpoints outside Paths are not served")
}

// The status page links per-cluster queries over every metric of a cluster,
// such as count_over_time({_id="c1"}[10m]): with __name__ dropped by each
// function they would fail on duplicate label sets, so the engine delays it.
func TestEngineDelaysNameRemoval(t *testing.T) {
	db, err := tsdb.Open(t.TempDir(), nil, nil, tsdb.DefaultOptions(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	app := db.Appender(context.Background())
	for _, name := range []string{"csv_succeeded", "cluster_version"} {
		_, err := app.Append(0, labels.FromStrings("__name__", name, "_id", "c1"), 1_000_000, 1)
		require.NoError(t, err)
	}
	require.NoError(t, app.Commit())
	h := NewHandler(discardLogger(), NewEngine(discardLogger(), nil, Options{}), tenantDBs{"acme": db}, Options{Version: "test"})
	r := httptest.NewRequest(http.MethodGet, "/api/v1/query?"+url.Values{"query": {`sum(count_over_time({_id="c1"}[10m]))`}, "time": {"1000"}}.Encode(), nil)
	r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: "acme"}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), `"value":[1000,"2"]`)
}

// TestCrossOriginRequest: a request carrying an Origin header (a browser,
// Grafana's browser access mode) is answered, not a panic (Prometheus' API
// code dereferences its CORS pattern), and no origin is allowed to read
// the answer: a token pasted in one site must not let another read the fleet.
func TestCrossOriginRequest(t *testing.T) {
	dbs := tenantDBs{"acme": openDB(t, map[string]float64{"a": 1})}
	h := NewHandler(discardLogger(), NewEngine(discardLogger(), nil, Options{}), dbs, Options{Version: "test"})
	for _, origin := range []string{"https://evil.example", "null", "http://receiver:9291"} {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/query?query=up&time=1000", nil)
		r.Header.Set("Origin", origin)
		r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: "acme"}))
		rec := httptest.NewRecorder()
		require.NotPanics(t, func() { h.ServeHTTP(rec, r) }, origin)
		require.Equal(t, http.StatusOK, rec.Code, origin)
		require.Empty(t, rec.Header().Get("Access-Control-Allow-Origin"), origin)
	}
}
