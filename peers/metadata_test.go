package peers

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/query"
)

// metadataIndex is a query.MetadataIndex over fixed per-tenant metadata.
type metadataIndex map[string]map[string][]metadata.Metadata

func (ix metadataIndex) Metadata(tenant, metric string, _ int) (map[string][]metadata.Metadata, error) {
	return query.MergeMetadata(query.MetadataQuery{Metric: metric, Limit: -1}, ix[tenant]), nil
}

// serveMetadata runs a replica's metadata endpoint over its own index, with
// s's authenticator, as the receiver mounts it.
func serveMetadata(t *testing.T, s *Set, own metadataIndex) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(metadataHandler(s, own))
	t.Cleanup(srv.Close)
	return srv
}

// metadataHandler is what serveMetadata serves.
func metadataHandler(s *Set, own metadataIndex) http.Handler {
	local := query.LocalMetadata(own)
	fleet := query.NewMetadataHandler(s.Metadata(local), nil)
	return auth.Middleware(s.Authenticator(tokens{}), auth.PermRead, nil, s.MetadataHandler(fleet, local, nil))
}

var (
	mdCounter  = metadata.Metadata{Type: model.MetricTypeCounter, Help: "Requests."}
	mdCounter2 = metadata.Metadata{Type: model.MetricTypeCounter, Help: "Requests served."}
	mdGauge    = metadata.Metadata{Type: model.MetricTypeGauge, Help: "Up."}
	mdSecret   = metadata.Metadata{Type: model.MetricTypeGauge, Help: "Secret."}
)

func TestFleetMetadataMergesPeersAndIsPartialWhenOneIsDown(t *testing.T) {
	f := newFixture(t)
	b := serveMetadata(t, f.set(t, nil, f.config()), metadataIndex{
		"acme":   {"requests_total": {mdCounter, mdCounter2}, "up": {mdGauge}},
		"globex": {"secret": {mdSecret}},
	})
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // connection refused

	reg := prometheus.NewRegistry()
	a := f.set(t, reg, f.config(host(b), host(down)))
	fleet := a.Metadata(query.LocalMetadata(metadataIndex{"acme": {"requests_total": {mdCounter}}}))
	ctx := context.Background()
	all := query.MetadataQuery{Limit: -1}

	got, ws, err := fleet.Metadata(ctx, "acme", all)
	require.NoError(t, err)
	require.Equal(t, map[string][]metadata.Metadata{
		"requests_total": {mdCounter, mdCounter2}, // mdCounter in both: once
		"up":             {mdGauge},
	}, got, "never another tenant's metadata")
	require.Len(t, ws, 1)
	require.ErrorContains(t, ws.AsErrors()[0], "peer "+host(down)+" unavailable, its metadata is missing")
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.reads.WithLabelValues("error")))
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.reads.WithLabelValues("success")))

	got, _, err = fleet.Metadata(ctx, "globex", all)
	require.NoError(t, err)
	require.Equal(t, map[string][]metadata.Metadata{"secret": {mdSecret}}, got, "the peer answers for the tenant asked")

	for _, tc := range []struct {
		q    query.MetadataQuery
		want map[string][]metadata.Metadata
	}{
		{query.MetadataQuery{Metric: "up", Limit: -1}, map[string][]metadata.Metadata{"up": {mdGauge}}},
		{query.MetadataQuery{Limit: 1}, map[string][]metadata.Metadata{"requests_total": {mdCounter, mdCounter2}}},
		{query.MetadataQuery{Limit: -1, LimitPerMetric: 1}, map[string][]metadata.Metadata{"requests_total": {mdCounter}, "up": {mdGauge}}},
	} {
		got, _, err := fleet.Metadata(ctx, "acme", tc.q)
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "%+v", tc.q)
	}
}

// getMetadata calls a receiver's metadata endpoint with hdr and returns the
// status and the families answered.
func getMetadata(t *testing.T, url string, hdr map[string]string) (int, []string) {
	t.Helper()
	code, data := getData[map[string]json.RawMessage](t, url+MetadataPath, hdr)
	var fams []string
	for f := range data {
		fams = append(fams, f)
	}
	return code, fams
}

func TestMetadataTenancy(t *testing.T) {
	f := newFixture(t)
	srv := serveMetadata(t, f.set(t, nil, f.config()), metadataIndex{
		"acme":   {"up": {mdGauge}},
		"globex": {"secret": {mdSecret}},
	})
	defer http.DefaultClient.CloseIdleConnections()
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		code int
		fams []string
	}{
		{"tenant token reads its tenant", map[string]string{"Authorization": "Bearer acme-read"}, 200, []string{"up"}},
		{"tenant header ignored with a tenant token", map[string]string{"Authorization": "Bearer acme-read", TenantHeader: "globex", ScopeHeader: ScopeLocal}, 200, []string{"up"}},
		{"no credential", nil, 401, nil},
		{"replica token reads the named tenant, local", map[string]string{"Authorization": "Bearer replica-secret", TenantHeader: "globex", ScopeHeader: ScopeLocal}, 200, []string{"secret"}},
		{"replica token needs local scope", map[string]string{"Authorization": "Bearer replica-secret", TenantHeader: "globex"}, 403, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, fams := getMetadata(t, srv.URL, tc.hdr)
			require.Equal(t, tc.code, code)
			require.Equal(t, tc.fams, fams)
		})
	}
}

func TestPeerMetadataAnswerIsBounded(t *testing.T) {
	f := newFixture(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// Larger than any peer may answer, and saying so (a chunked one
		// is cut while it streams: TestAnswerIsCutAtTheCap).
		w.Header().Set("Content-Length", strconv.Itoa(maxAPIAnswer+1))
		_, _ = io.WriteString(w, `{"status":"success","data":{"up":[{"type":"gauge","help":"Up.","unit":""}]}`)
		pad := strings.Repeat(" ", 1<<20)
		for range maxAPIAnswer >> 20 {
			if _, err := io.WriteString(w, pad); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	s := f.set(t, nil, f.config(host(srv)))
	got, ws, err := s.Metadata(query.LocalMetadata(metadataIndex{})).Metadata(context.Background(), "acme", query.MetadataQuery{Limit: -1})
	require.NoError(t, err)
	require.Empty(t, got)
	require.Len(t, ws, 1)
	require.ErrorContains(t, ws.AsErrors()[0], "answer exceeds")
}

func TestMetadataRecognisesItself(t *testing.T) {
	f := newFixture(t)
	var s *Set
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serveHandler := s.MetadataHandler(http.NotFoundHandler(), query.LocalMetadata(metadataIndex{}), nil)
		serveHandler.ServeHTTP(w, r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: "acme"})))
	}))
	t.Cleanup(srv.Close)
	s = f.set(t, nil, f.config(host(srv)))
	_, ws, err := s.Metadata(query.LocalMetadata(metadataIndex{})).Metadata(context.Background(), "acme", query.MetadataQuery{Limit: -1})
	require.NoError(t, err)
	require.Empty(t, ws)
	require.Empty(t, s.snapshot(), "this receiver is left out once it answered")
}
