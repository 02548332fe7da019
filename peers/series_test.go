package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/query"
)

// seriesAPI calls the series API of h (the query API over a fleet reader)
// as tenant and returns the series and the warnings.
func seriesAPI(t *testing.T, h http.Handler, tenant string, form url.Values) ([]map[string]string, []string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, query.SeriesPath+"?"+form.Encode(), nil)
	r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: tenant, Allow: auth.PermRead}))
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

func op(name, id string) map[string]string {
	return map[string]string{"__name__": "csv_succeeded", "name": name, "_id": id}
}

func TestFleetSeriesAskPeersIndexNotSamples(t *testing.T) {
	f := newFixture(t)
	b, bReads := serveCounted(t, f.set(t, nil, f.config()), tenantDBs{
		// Last to first: a peer that kept any series under a limit, not
		// the smallest, would answer z and y.
		"acme": openSeries(t, csv("z-op", "c2"), csv("y-op", "c2"), csv("x-op", "c2"), csv("w-op", "c2"), csv("b-op", "c2"), csv("a-op", "c1"),
			labels.FromStrings("__name__", "up", "_id", "c2")),
		"globex": openSeries(t, labels.FromStrings("__name__", "secret", "name", "hidden")),
	}, nil)
	reg := prometheus.NewRegistry()
	a := f.set(t, reg, f.config(host(b)))
	// a-op of c1 is on both: listed once.
	reader := a.NewReader(tenantDBs{"acme": openSeries(t, csv("c-op", "c3"), csv("a-op", "c1"))})
	api := query.NewHandler(discard, nil, reader, query.Options{})

	csvs := url.Values{"match[]": {"csv_succeeded"}}
	got, ws := seriesAPI(t, api, "acme", csvs)
	require.Empty(t, ws)
	require.Equal(t, []map[string]string{
		op("a-op", "c1"), op("b-op", "c2"), op("w-op", "c2"), op("x-op", "c2"), op("y-op", "c2"), op("z-op", "c2"), op("c-op", "c3"),
	}, got, "in label order")

	got, ws = seriesAPI(t, api, "acme", url.Values{"match[]": {"csv_succeeded"}, "limit": {"2"}})
	require.Equal(t, []map[string]string{op("a-op", "c1"), op("b-op", "c2")}, got, "the fleet's first under a limit")
	require.Equal(t, []string{"results truncated due to limit"}, ws, "once, the API's own")

	got, _ = seriesAPI(t, api, "acme", url.Values{"match[]": {`{name=~"[yz]-op"}`, "up"}})
	require.Equal(t, []map[string]string{op("y-op", "c2"), op("z-op", "c2"), {"__name__": "up", "_id": "c2"}}, got, "several match[]")

	got, _ = seriesAPI(t, api, "acme", url.Values{"match[]": {"csv_succeeded"}, "start": {"2"}, "end": {"10"}})
	require.Empty(t, got, "the range is the peer's too")

	got, _ = seriesAPI(t, api, "globex", url.Values{"match[]": {`{name!=""}`}})
	require.Equal(t, []map[string]string{{"__name__": "secret", "name": "hidden"}}, got, "the peer answers for the tenant asked, only")

	withDown := query.NewHandler(discard, nil, f.set(t, nil, f.config(host(b), deadPeer)).NewReader(tenantDBs{}), query.Options{})
	got, ws = seriesAPI(t, withDown, "acme", url.Values{"match[]": {"up"}})
	require.Equal(t, []map[string]string{{"__name__": "up", "_id": "c2"}}, got)
	require.Len(t, ws, 1, "the API reads the warnings before the series: they are known by then")
	require.Contains(t, ws[0], "peer "+deadPeer+" unavailable, its data is missing")

	require.Zero(t, bReads.Load(), "no series read for series calls")
	require.Equal(t, 6.0, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callSeries, "labels")))
	require.Zero(t, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callSeries, "series")))
	require.Zero(t, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "labels")))
}

func TestSeriesCallsFallBackToRemoteReadForAPreviousRelease(t *testing.T) {
	local := tenantDBs{"acme": openSeries(t, csv("b-op", "c2"))}
	f := newFixture(t)
	old := f.set(t, nil, f.config())
	mux := http.NewServeMux()
	mux.Handle("POST /api/v1/read", auth.Middleware(old.Authenticator(tokens{}), auth.PermRead, nil,
		old.Handler(discard, nil, local, local, nil, query.ReadOptions{})))
	// Its query API, which does not take the replica token.
	mux.Handle("/api/v1/", auth.Middleware(tokens{}, auth.PermRead, nil, query.NewHandler(discard, nil, local, query.Options{})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	a := f.set(t, prometheus.NewRegistry(), f.config(host(srv)))
	api := query.NewHandler(discard, nil, a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}), query.Options{})
	for range 2 {
		got, ws := seriesAPI(t, api, "acme", url.Values{"match[]": {"csv_succeeded"}})
		require.Empty(t, ws)
		require.Equal(t, []map[string]string{op("a-op", "c1"), op("b-op", "c2")}, got)
	}
	require.Equal(t, 2.0, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callSeries, "series")))
	require.Zero(t, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callSeries, "labels")))
}

func TestSeriesCallsTenancy(t *testing.T) {
	f := newFixture(t)
	srv := serve(t, f.set(t, nil, f.config()), tenantDBs{
		"acme":   openSeries(t, csv("a-op", "c1")),
		"globex": openSeries(t, labels.FromStrings("__name__", "secret", "_id", "g1")),
	}, nil)
	defer http.DefaultClient.CloseIdleConnections()
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		code int
		want []map[string]string
	}{
		{"tenant token reads its tenant", map[string]string{"Authorization": "Bearer acme-read"}, 200, []map[string]string{op("a-op", "c1")}},
		{"tenant header ignored with a tenant token", map[string]string{"Authorization": "Bearer acme-read", TenantHeader: "globex", ScopeHeader: ScopeLocal}, 200, []map[string]string{op("a-op", "c1")}},
		{"no credential", nil, 401, nil},
		{"replica token reads the named tenant, local", map[string]string{"Authorization": "Bearer replica-secret", TenantHeader: "globex", ScopeHeader: ScopeLocal}, 200, []map[string]string{{"__name__": "secret", "_id": "g1"}}},
		{"replica token needs local scope", map[string]string{"Authorization": "Bearer replica-secret", TenantHeader: "globex"}, 403, nil},
	} {
		for _, post := range []bool{false, true} { // peers ask with a POST form
			t.Run(fmt.Sprintf("%s/post=%v", tc.name, post), func(t *testing.T) {
				form := url.Values{"match[]": {`{__name__=~".+"}`}}.Encode()
				req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+query.SeriesPath+"?"+form, nil)
				if post {
					req, err = http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+query.SeriesPath, strings.NewReader(form))
					req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				}
				require.NoError(t, err)
				for k, v := range tc.hdr {
					req.Header.Set(k, v)
				}
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				require.Equal(t, tc.code, resp.StatusCode)
				if tc.code != http.StatusOK {
					return
				}
				require.Equal(t, tc.hdr[ScopeHeader], resp.Header.Get(ScopeHeader), "a local-scope answer says so, a fleet one does not")
				var out struct{ Data []map[string]string }
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
				require.Equal(t, tc.want, out.Data)
			})
		}
	}
}
