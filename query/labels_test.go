package query

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// openValuesDB holds one series up{v=<value>} per value, created in the
// order given, at t=1000s.
func openValuesDB(t *testing.T, values ...string) *tsdb.DB {
	t.Helper()
	db, err := tsdb.Open(t.TempDir(), nil, nil, tsdb.DefaultOptions(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	app := db.Appender(context.Background())
	for _, v := range values {
		_, err := app.Append(0, labels.FromStrings("__name__", "up", "v", v), 1_000_000, 1)
		require.NoError(t, err)
	}
	require.NoError(t, app.Commit())
	return db
}

func TestIndexHandler(t *testing.T) {
	dbs := tenantDBs{
		// Created last to first: the head holds values in creation order,
		// so a limit without LimitSmallest keeps "z".
		"acme":   openValuesDB(t, "z", "y", "c", "b", "a"),
		"globex": openValuesDB(t, "secret"),
	}
	h := NewIndexHandler(discardLogger(), dbs, nil)
	get := func(tenant, path string, form url.Values) (int, []string, []string) {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, path+"?"+form.Encode(), nil)
		r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: tenant}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		var body struct {
			Data     []string `json:"data"`
			Warnings []string `json:"warnings"`
		}
		if rec.Code == http.StatusOK {
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
		}
		return rec.Code, body.Data, body.Warnings
	}

	for _, tc := range []struct {
		name, tenant, path string
		form               url.Values
		want               []string
		warn               bool
	}{
		{"values", "acme", "/api/v1/label/v/values", nil, []string{"a", "b", "c", "y", "z"}, false},
		{"values of the tenant only", "globex", "/api/v1/label/v/values", nil, []string{"secret"}, false},
		{"the smallest under limit", "acme", "/api/v1/label/v/values", url.Values{"limit": {"2"}}, []string{"a", "b"}, true},
		{"matchers", "acme", "/api/v1/label/v/values", url.Values{"match[]": {`{v=~"[ab]"}`}}, []string{"a", "b"}, false},
		{"names", "acme", "/api/v1/labels", nil, []string{"__name__", "v"}, false},
		{"names under limit", "acme", "/api/v1/labels", url.Values{"limit": {"1"}}, []string{"__name__"}, true},
		{"names, matchers", "acme", "/api/v1/labels", url.Values{"match[]": {`{v="nope"}`}}, []string{}, false},
		{"range before the data", "acme", "/api/v1/label/v/values", url.Values{"start": {"0"}, "end": {"999.999"}}, []string{}, false},
		{"range over the data", "acme", "/api/v1/label/v/values", url.Values{"start": {"1000"}, "end": {"1000"}}, []string{"a", "b", "c", "y", "z"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, got, ws := get(tc.tenant, tc.path, tc.form)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, tc.want, got)
			if tc.warn {
				require.Equal(t, []string{"results truncated due to limit"}, ws)
			} else {
				require.Empty(t, ws)
			}
		})
	}

	code, _, _ := get("acme", "/api/v1/query", url.Values{"query": {"up"}})
	require.Equal(t, http.StatusNotFound, code, "index calls only")

	series := func(tenant string, form url.Values) ([]map[string]string, []string) {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, SeriesPath+"?"+form.Encode(), nil)
		r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: tenant}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var body struct {
			Data     []map[string]string `json:"data"`
			Warnings []string            `json:"warnings"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
		return body.Data, body.Warnings
	}
	up := func(v string) map[string]string { return map[string]string{"__name__": "up", "v": v} }
	got, ws := series("acme", url.Values{"match[]": {"up"}, "limit": {"2"}})
	require.Equal(t, []map[string]string{up("a"), up("b")}, got, "the smallest series under limit, not the first created")
	require.Equal(t, []string{"results truncated due to limit"}, ws)
	got, ws = series("globex", url.Values{"match[]": {"up"}})
	require.Equal(t, []map[string]string{up("secret")}, got, "the tenant's only")
	require.Empty(t, ws)
}
