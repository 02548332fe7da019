package peers

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/internal/logbuf"
	"github.com/phonehome/phonehome/query"
)

// openSeries holds one sample at t=1s for each series, created in the
// order given (the head keeps label values in creation order).
func openSeries(t *testing.T, series ...labels.Labels) *tsdb.DB {
	t.Helper()
	db, err := tsdb.Open(t.TempDir(), nil, nil, tsdb.DefaultOptions(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	app := db.Appender(context.Background())
	for _, ls := range series {
		_, err := app.Append(0, ls, 1000, 1)
		require.NoError(t, err)
	}
	require.NoError(t, app.Commit())
	return db
}

func csv(name, id string) labels.Labels {
	return labels.FromStrings("__name__", "csv_succeeded", "name", name, "_id", id)
}

func TestFleetLabelCallsAskPeersNotSeries(t *testing.T) {
	f := newFixture(t)
	b, bReads := serveCounted(t, f.set(t, nil, f.config()), tenantDBs{
		// Last to first: a peer that kept any values under a limit, not
		// the smallest, would answer x and y.
		"acme": openSeries(t, csv("z-op", "c2"), csv("y-op", "c2"), csv("x-op", "c2"), csv("b-op", "c2"),
			labels.FromStrings("__name__", "up", "k8s.namespace", "kube-system", "_id", "c2")),
		"globex": openSeries(t, labels.FromStrings("__name__", "secret", "name", "hidden")),
	}, nil)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // connection refused

	reg := prometheus.NewRegistry()
	a := f.set(t, reg, f.config(host(b), host(down)))
	r := a.NewReader(tenantDBs{"acme": openSeries(t, csv("w-op", "c1"), csv("v-op", "c1"), csv("a-op", "c1"))})
	ctx := context.Background()
	csvOnly := labels.MustNewMatcher(labels.MatchEqual, "__name__", "csv_succeeded")
	call := func(tenant string, mint, maxt int64, f func(q promstorage.Querier) ([]string, error)) []string {
		t.Helper()
		q, err := r.Querier(tenant, mint, maxt)
		require.NoError(t, err)
		defer func() { require.NoError(t, q.Close()) }()
		got, err := f(q)
		require.NoError(t, err)
		return got
	}
	values := func(tenant string, mint, maxt int64, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) []string {
		t.Helper()
		return call(tenant, mint, maxt, func(q promstorage.Querier) ([]string, error) {
			vals, ws, err := q.LabelValues(ctx, name, hints, ms...)
			require.Len(t, ws, 1, "the peer that is down")
			require.ErrorContains(t, ws.AsErrors()[0], "peer "+host(down)+" unavailable, its data is missing")
			return vals, err
		})
	}
	names := func(tenant string, hints *promstorage.LabelHints, ms ...*labels.Matcher) []string {
		t.Helper()
		return call(tenant, 0, 10_000, func(q promstorage.Querier) ([]string, error) {
			names, ws, err := q.LabelNames(ctx, hints, ms...)
			require.Len(t, ws, 1, "the peer that is down")
			return names, err
		})
	}

	require.Equal(t, []string{"a-op", "b-op", "v-op", "w-op", "x-op", "y-op", "z-op"}, values("acme", 0, 10_000, "name", nil, csvOnly))
	require.Equal(t, []string{"a-op", "b-op"}, values("acme", 0, 10_000, "name", &promstorage.LabelHints{Limit: 2}, csvOnly),
		"the first of the fleet's under a limit, the peer's and this receiver's")
	require.Equal(t, []string{"kube-system"}, values("acme", 0, 10_000, "k8s.namespace", nil), "a UTF-8 name")
	require.Empty(t, values("acme", 2000, 10_000, "name", nil), "the range is the peer's too")
	require.Equal(t, []string{"hidden"}, values("globex", 0, 10_000, "name", nil), "the peer answers for the tenant asked, only")
	require.Equal(t, []string{"__name__", "_id", "k8s.namespace", "name"}, names("acme", nil))
	require.Equal(t, []string{"__name__", "_id", "name"}, names("acme", nil, csvOnly))
	require.Equal(t, []string{"__name__", "_id"}, names("acme", &promstorage.LabelHints{Limit: 2}))
	require.Equal(t, []string{"__name__", "name"}, names("globex", nil))

	require.Zero(t, bReads.Load(), "no series read for label calls")
	require.Equal(t, 9.0, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "labels")))
	require.Zero(t, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "series")))
	require.Equal(t, 9.0, testutil.ToFloat64(a.m.reads.WithLabelValues("success")))
	require.Equal(t, 9.0, testutil.ToFloat64(a.m.reads.WithLabelValues("error")))
}

// labelValuesAt calls a receiver's label values endpoint for __name__ with
// hdr and returns the status and the values.
func labelValuesAt(t *testing.T, url string, hdr map[string]string) (int, []string) {
	t.Helper()
	return getData[[]string](t, url+"/api/v1/label/__name__/values", hdr)
}

// getData GETs url with hdr and returns the status and, on a 200, the
// answer's data.
func getData[T any](t *testing.T, url string, hdr map[string]string) (int, T) {
	t.Helper()
	var out struct{ Data T }
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, out.Data
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out.Data
}

func TestLabelCallsTenancy(t *testing.T) {
	f := newFixture(t)
	srv := serve(t, f.set(t, nil, f.config()), tenantDBs{
		"acme":   openDB(t, map[string][]int64{"a": {1000}}),
		"globex": openDB(t, map[string][]int64{"g": {1000}}),
	}, nil)
	defer http.DefaultClient.CloseIdleConnections()
	for _, tc := range []struct {
		name   string
		hdr    map[string]string
		code   int
		values []string
	}{
		{"tenant token reads its tenant", map[string]string{"Authorization": "Bearer acme-read"}, 200, []string{"a"}},
		{"tenant token, local", map[string]string{"Authorization": "Bearer acme-read", ScopeHeader: ScopeLocal}, 200, []string{"a"}},
		{"tenant header ignored with a tenant token", map[string]string{"Authorization": "Bearer acme-read", TenantHeader: "globex", ScopeHeader: ScopeLocal}, 200, []string{"a"}},
		{"no credential", nil, 401, nil},
		{"replica token reads the named tenant, local", map[string]string{"Authorization": "Bearer replica-secret", TenantHeader: "globex", ScopeHeader: ScopeLocal}, 200, []string{"g"}},
		{"replica token needs local scope", map[string]string{"Authorization": "Bearer replica-secret", TenantHeader: "globex"}, 403, nil},
		{"replica token needs a tenant", map[string]string{"Authorization": "Bearer replica-secret", ScopeHeader: ScopeLocal}, 401, nil},
		{"replica token with an invalid tenant", map[string]string{"Authorization": "Bearer replica-secret", ScopeHeader: ScopeLocal, TenantHeader: "../x"}, 401, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, values := labelValuesAt(t, srv.URL, tc.hdr)
			require.Equal(t, tc.code, code)
			require.Equal(t, tc.values, values)
		})
	}
}

func TestLabelCallsFallBackToSeriesForAPreviousRelease(t *testing.T) {
	local := tenantDBs{"acme": openSeries(t, csv("b-op", "c2"))}
	for _, tc := range []struct {
		name string
		api  http.Handler // what the previous release serves under /api/v1/
	}{
		// Its query API, which does not take the replica token.
		{"replica token refused", auth.Middleware(tokens{}, auth.PermRead, nil, query.NewHandler(discard, nil, local, query.Options{}))},
		{"not found", http.NotFoundHandler()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			old := f.set(t, nil, f.config())
			mux := http.NewServeMux()
			mux.Handle("POST /api/v1/read", auth.Middleware(old.Authenticator(tokens{}), auth.PermRead, nil,
				old.Handler(discard, nil, local, local, nil, query.ReadOptions{})))
			mux.Handle("/api/v1/", tc.api)
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)

			var logs logbuf.Buffer
			cfg := f.config(host(srv))
			require.NoError(t, cfg.Validate())
			a, err := New(slog.New(slog.NewJSONHandler(&logs, nil)), prometheus.NewRegistry(), cfg, Options{HTTPClient: f.client})
			require.NoError(t, err)
			r := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))})
			for range 2 {
				q, err := r.Querier("acme", 0, 10_000)
				require.NoError(t, err)
				vals, ws, err := q.LabelValues(context.Background(), "name", nil)
				require.NoError(t, err)
				require.Empty(t, ws)
				require.Equal(t, []string{"a-op", "b-op"}, vals)
				names, ws, err := q.LabelNames(context.Background(), &promstorage.LabelHints{Limit: 2})
				require.NoError(t, err)
				require.Empty(t, ws)
				require.Equal(t, []string{"__name__", "_id"}, names)
				require.NoError(t, q.Close())
			}
			require.Equal(t, 4.0, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "series")))
			require.Zero(t, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "labels")))
			require.Equal(t, 1, strings.Count(logs.String(), "peer does not serve index calls"), "logged once: %s", logs.String())
		})
	}
}
