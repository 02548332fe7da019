package peers

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/promql"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/pushdown"
	"github.com/phonehome/phonehome/query"
)

// servePushdown runs a replica's pushdown endpoint over local, with s's
// authenticator (the replica token, local scope) as the receiver mounts it.
func servePushdown(t *testing.T, s *Set, local tenantDBs) *httptest.Server {
	t.Helper()
	eng := promql.NewEngine(promql.EngineOpts{Logger: discard, MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	h := auth.Middleware(s.Authenticator(tokens{}), auth.PermRead, nil,
		s.WithInstance(pushdown.NewHandler(discard, eng, query.NewQueryable(local), "_id", nil)))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func TestPushdownShardsAskPeersForTheirTenantOnly(t *testing.T) {
	f := newFixture(t)
	peer := servePushdown(t, f.set(t, nil, f.config()), tenantDBs{
		"acme":  openDB(t, map[string][]int64{"up": {1000, 2000}}),
		"other": openDB(t, map[string][]int64{"up": {1000}, "secret": {1000}}),
	})
	reg := prometheus.NewRegistry()
	s := f.set(t, reg, f.config(host(peer)))
	shards := s.Shards()
	require.Len(t, shards, 1)
	require.Equal(t, "peer "+host(peer), shards[0].Name())

	ctx := auth.WithIdentity(context.Background(), auth.Identity{Tenant: "acme", Allow: auth.PermRead})
	res, err := shards[0].Eval(ctx, pushdown.Request{Query: `count({__name__=~".+"})`, Start: time.UnixMilli(2000), End: time.UnixMilli(2000)})
	require.NoError(t, err)
	require.Len(t, res.Series, 1)
	require.Equal(t, 1.0, res.Series[0].Floats[0].F, "acme's one series, not other's")
	require.Equal(t, []string{"c1"}, res.Keys)
	require.Equal(t, 1.0, testutil.ToFloat64(s.m.reads.WithLabelValues("success")))
}

func TestPushdownShardErrors(t *testing.T) {
	f := newFixture(t)
	status := func(code int) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "no", code)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	ctx := auth.WithIdentity(context.Background(), auth.Identity{Tenant: "acme", Allow: auth.PermRead})
	req := pushdown.Request{Query: `up`, Start: time.UnixMilli(1000), End: time.UnixMilli(1000)}
	for code, unavailable := range map[int]bool{
		http.StatusNotFound:            false, // an older receiver: evaluated merged
		http.StatusUnprocessableEntity: false,
		http.StatusServiceUnavailable:  true, // a warning, its data missing
		http.StatusUnauthorized:        true,
	} {
		srv := status(code)
		_, err := f.set(t, nil, f.config(host(srv))).Shards()[0].Eval(ctx, req)
		require.Error(t, err)
		require.Equal(t, unavailable, errors.Is(err, pushdown.ErrUnavailable), "%d: %v", code, err)
	}
	srv := status(http.StatusOK)
	srv.Close()
	_, err := f.set(t, nil, f.config(host(srv))).Shards()[0].Eval(ctx, req)
	require.ErrorIs(t, err, pushdown.ErrUnavailable, "refused")
}

func TestPushdownRecognisesItself(t *testing.T) {
	f := newFixture(t)
	var s *Set
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.WithInstance(http.NotFoundHandler()).ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s = f.set(t, nil, f.config(host(srv)))
	require.Len(t, s.Shards(), 1)
	ctx := auth.WithIdentity(context.Background(), auth.Identity{Tenant: "acme", Allow: auth.PermRead})
	_, err := s.Shards()[0].Eval(ctx, pushdown.Request{Query: `up`, Start: time.UnixMilli(1000), End: time.UnixMilli(1000)})
	require.Error(t, err)
	require.Empty(t, s.Shards(), "this receiver is left out once it answered")
}
