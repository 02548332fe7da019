package receive

import (
	"context"
	"log/slog"
	"math"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// discardWriter accepts everything and keeps nothing.
type discardWriter struct{}

func (discardWriter) Write(_ context.Context, _ string, series []prompb.TimeSeries) (storage.Stats, error) {
	var st storage.Stats
	for _, ts := range series {
		st.Samples += len(ts.Samples)
		st.Histograms += len(ts.Histograms)
	}
	return st, nil
}

// newLimiter returns a limiter with the default limits, changed by mod.
func newLimiter(mod func(*limits.Spec)) *limits.Limiter {
	var cfg limits.Config
	if mod != nil {
		mod(&cfg.Defaults)
	}
	cfg.SetDefaults()
	return limits.New(nil, cfg, nil)
}

func ptr[T any](v T) *T { return &v }

// storedSeries returns every series of tenant in db, as sorted label strings.
func storedSeries(t *testing.T, db *storage.DB, tenant string) []string {
	t.Helper()
	q, err := db.Querier(tenant, math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	set := q.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	var got []string
	for set.Next() {
		got = append(got, set.At().Labels().String())
	}
	require.NoError(t, set.Err())
	return got
}
