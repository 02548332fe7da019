package rules

import (
	"context"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/stretchr/testify/require"
)

// TestRestoreQueryableSelectsAfterNext: the `for` state restore selects
// once per alerting rule over one querier, each set iterated before the
// next Select. Through restoreQueryable, the fleet view (a merge with a
// secondary) reads both times.
func TestRestoreQueryableSelectsAfterNext(t *testing.T) {
	reader := &fleetReader{local: clusterDB(t, "a"), peer: clusterDB(t, "b")}
	fleet := promstorage.QueryableFunc(func(mint, maxt int64) (promstorage.Querier, error) {
		return reader.Querier("acme", mint, maxt)
	})
	ctx := context.Background()
	up := labels.MustNewMatcher(labels.MatchEqual, model.MetricNameLabel, "up")
	selectTwice := func(q promstorage.Querier) int {
		n := 0
		for range 2 {
			ss := q.Select(ctx, false, nil, up)
			for ss.Next() {
				n++
			}
			require.NoError(t, ss.Err())
		}
		return n
	}

	// fleet.Querier would panic on the second Select, in a goroutine of
	// the merge (not recoverable here): that is what TestPartialDataSkipsEvaluation
	// ran into, with two alerting rules in its group, before restoreQueryable.
	q, err := restoreQueryable{fleet}.Querier(0, 1<<62)
	require.NoError(t, err)
	require.Equal(t, 4, selectTwice(q))
	require.Len(t, q.(*perSelectQuerier).opened, 2)
	require.NoError(t, q.Close())
	require.Empty(t, q.(*perSelectQuerier).opened)
}
