package fleet

import (
	"context"
	"log/slog"
	"testing"
	"time"

	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/query"
)

// BenchmarkQuery runs fleet-dashboard and fleet-rule PromQL over the
// receiver's storage: the head of one tenant holding 200 clusters × 500
// series with 8 points each. Built with and without -tags dedupelabels it
// shows what the smaller head labels cost reads, which resolve every
// selected series' labels through the symbol table:
//
//	go test -run '^$' -bench Query ./bench/fleet/                     # stringlabels
//	go test -tags dedupelabels -run '^$' -bench Query ./bench/fleet/  # as shipped
func BenchmarkQuery(b *testing.B) {
	const (
		clusters = 200
		series   = 500
		rounds   = 8
		stepMs   = 30_000
	)
	f, err := New(templates(b), clusters, series, 1)
	require.NoError(b, err)
	db, h := openIngest(b, unlimitedRates(nil), nil)
	t0 := time.Now().Add(-time.Hour).UnixMilli()
	writeRounds(b, h, f, rounds, t0, stepMs)
	at := time.UnixMilli(t0 + (rounds-1)*stepMs)
	eng := query.NewEngine(slog.New(slog.DiscardHandler), nil, query.Options{})
	q := promstorage.QueryableFunc(func(mint, maxt int64) (promstorage.Querier, error) {
		return db.Querier("fleet", mint, maxt)
	})
	for _, tc := range []struct{ name, expr string }{
		{"csv_by_version", `count by (name, version) (csv_succeeded)`},
		{"operator_conditions", `sum by (name, condition) (cluster_operator_conditions)`},
		// The per-cluster series count of the fleet rules: every series.
		{"series_per_cluster", `count by (_id) ({_id!="", __name__!~"phonehome:.*|ALERTS|ALERTS_FOR_STATE"})`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			run := func() int {
				qry, err := eng.NewInstantQuery(context.Background(), q, nil, tc.expr, at)
				require.NoError(b, err)
				defer qry.Close()
				vec, err := qry.Exec(context.Background()).Vector()
				require.NoError(b, err)
				return len(vec)
			}
			require.NotZero(b, run(), "the query selects nothing")
			b.ReportAllocs()
			for b.Loop() {
				run()
			}
		})
	}
}
