package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/peers"
	"github.com/phonehome/phonehome/pushdown"
	"github.com/phonehome/phonehome/query"
)

// fanoutQueries are the fleet dashboards' queries over raw series
// (deploy/grafana) and the fleet rules behind their recorded panels
// (deploy/rules), as one replica evaluates them over the whole fleet.
var fanoutQueries = []struct{ name, expr string }{
	{"csv_running_by_version", `count by (name, version) (csv_succeeded)`},
	{"csv_abnormal_by_reason", `count by (name, version, phase, reason) (max_over_time(csv_abnormal[15m]))`},
	{"operator_conditions", `sum by (name, condition) (cluster_operator_conditions)`},
	{"versions_by_cluster", `max by (_id, version) (cluster_version)`},
	// Every series of the fleet (the per-cluster series count rule).
	{"series_per_cluster", `count by (_id) ({_id!="", __name__!~"phonehome:.*|ALERTS|ALERTS_FOR_STATE"})`},
}

// BenchmarkFanout measures the dashboard queries on one replica of N that
// shard 400 clusters × 500 series (200k series, 8 points each) by cluster,
// against one receiver holding everything (replicas=1). With more than one
// replica it runs each query both ways: mode=merge reads the other N-1
// replicas' heads through remote read over loopback HTTP and evaluates over
// the merged series; mode=pushdown evaluates the query's parts on each
// replica (pushdown.Path) and combines them, as the receiver does by
// default. It reports the p50 and p99 latency of each query:
//
//	go test -tags dedupelabels -run '^$' -bench Fanout -benchtime 200x ./bench/fleet/
func BenchmarkFanout(b *testing.B) {
	const (
		clusters = 400
		series   = 500
		rounds   = 8
		stepMs   = 30_000
	)
	f, err := New(templates(b), clusters, series, 1)
	require.NoError(b, err)
	t0 := time.Now().Add(-time.Hour).UnixMilli()
	at := time.UnixMilli(t0 + (rounds-1)*stepMs)
	eng := query.NewEngine(slog.New(slog.DiscardHandler), nil, query.Options{})
	ctx := auth.WithIdentity(context.Background(), auth.Identity{Tenant: "fleet", Allow: auth.PermRead})
	for _, n := range []int{1, 2, 4} {
		sf := shardedFleet(b, f, n, rounds, t0, stepMs, eng)
		q := query.NewQueryable(sf.fleet)
		modes := []struct {
			name string
			eng  promql.QueryEngine
		}{{"merge", eng}}
		if n > 1 {
			modes = append(modes, struct {
				name string
				eng  promql.QueryEngine
			}{"pushdown", pushdown.New(slog.New(slog.DiscardHandler), nil, eng, pushdown.Options{
				ClusterLabel: ClusterLabel, Local: query.NewQueryable(sf.local), Peers: sf.peers.Shards,
			})})
		}
		for _, mode := range modes {
			for _, tc := range fanoutQueries {
				name := fmt.Sprintf("replicas=%d/%s", n, tc.name)
				if n > 1 {
					name = fmt.Sprintf("replicas=%d/mode=%s/%s", n, mode.name, tc.name)
				}
				b.Run(name, func(b *testing.B) { benchQuery(ctx, b, mode.eng, q, tc.expr, at) })
			}
		}
	}
}

// benchQuery runs expr at at until b is done and reports its p50 and p99.
func benchQuery(ctx context.Context, b *testing.B, eng promql.QueryEngine, q promstorage.Queryable, expr string, at time.Time) {
	run := func() int {
		qry, err := eng.NewInstantQuery(ctx, q, nil, expr, at)
		require.NoError(b, err)
		defer qry.Close()
		res := qry.Exec(ctx)
		require.NoError(b, res.Err)
		require.Empty(b, res.Warnings)
		vec, err := res.Vector()
		require.NoError(b, err)
		return len(vec)
	}
	require.NotZero(b, run(), "the query selects nothing")
	var lat []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		run()
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// shardedReplica is replica 0 of a sharded fleet.
type shardedReplica struct {
	local query.Reader // its own storage
	fleet query.Reader // its fleet view: its storage and the peers' (remote read)
	peers *peers.Set   // the other replicas; none when n is 1
}

// shardedFleet writes f into n receivers' storage, cluster c into replica
// c mod n, serves replicas 1..n-1 over remote read and pushdown.Path on
// loopback, and returns replica 0.
func shardedFleet(b *testing.B, f *Fleet, n, rounds int, t0, stepMs int64, eng promql.QueryEngine) shardedReplica {
	b.Helper()
	logger := slog.New(slog.DiscardHandler)
	var endpoints []string
	var local query.Reader
	for i := range n {
		db, h := openIngest(b, unlimitedRates(nil), nil)
		var fb Batch
		for r := range rounds {
			for c := i; c < f.Clusters(); c += n {
				f.Fill(&fb, c, 0, f.SeriesPerCluster(), r, t0, stepMs)
				postWrite(b, h, contentTypeV1, encodeV1(b, fb.Series), f.ClusterID(c))
			}
		}
		if i == 0 {
			local = db
			continue
		}
		set, err := peers.New(logger, nil, peerConfig(), peers.Options{})
		require.NoError(b, err)
		mux := http.NewServeMux()
		mux.Handle("/api/v1/read", set.Handler(logger, nil, db, db, db.PeerHorizon, query.ReadOptions{}))
		mux.Handle(pushdown.Path, set.WithInstance(pushdown.NewHandler(logger, eng, query.NewQueryable(db), ClusterLabel, nil)))
		srv := httptest.NewServer(auth.Middleware(auth.Insecure{Tenant: "fleet"}, auth.PermRead, nil, mux))
		b.Cleanup(srv.Close)
		endpoints = append(endpoints, strings.TrimPrefix(srv.URL, "http://"))
	}
	if n == 1 {
		return shardedReplica{local: local, fleet: local}
	}
	cfg := peerConfig()
	cfg.Endpoints = endpoints
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	b.Cleanup(client.CloseIdleConnections)
	set, err := peers.New(logger, nil, cfg, peers.Options{HTTPClient: client})
	require.NoError(b, err)
	return shardedReplica{local: local, fleet: set.NewReader(local), peers: set}
}

func peerConfig() peers.Config {
	var c peers.Config
	c.SetDefaults()
	return c
}
