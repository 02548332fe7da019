package rules

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/query"
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
	q, err := restoreQueryable{q: fleet}.Querier(0, 1<<62)
	require.NoError(t, err)
	require.Equal(t, 4, selectTwice(q))
	require.Len(t, q.(*perSelectQuerier).opened, 2)
	require.NoError(t, q.Close())
	require.Empty(t, q.(*perSelectQuerier).opened)
}

// TestRestoreRereadsPartialAnswers: a `for` state read that lacks data is
// read again after a wait, 3 reads for the group at most, then fails, so
// that the rule's alerts are not restored from it; a stop ends the wait.
// For a rule that holds no alert, there is nothing to restore.
func TestRestoreRereadsPartialAnswers(t *testing.T) {
	forState := labels.MustNewMatcher(labels.MatchEqual, model.MetricNameLabel, "ALERTS_FOR_STATE")
	for _, tc := range []struct {
		name            string
		partialReads    int
		stopped         bool
		noAlerts        bool
		wantSeries      int
		wantWait        time.Duration
		retried, failed float64
	}{
		{name: "whole", partialReads: 0, wantSeries: 1},
		{name: "whole at the second read", partialReads: 1, wantSeries: 1, wantWait: time.Second, retried: 1},
		{name: "whole at the third read", partialReads: 2, wantSeries: 1, wantWait: 3 * time.Second, retried: 2},
		{name: "never whole", partialReads: 99, wantWait: 3 * time.Second, retried: 2, failed: 1},
		{name: "stopped", partialReads: 99, stopped: true, failed: 1},
		{name: "no alert to restore", partialReads: 99, noAlerts: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				stop, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.stopped {
					cancel()
				}
				fq := &flakyQueryable{partialReads: tc.partialReads}
				partial := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "partial"}, []string{"result"})
				holdAlerts := func([]*labels.Matcher) bool { return !tc.noAlerts }
				q, err := restoreQueryable{q: fq, stop: stop, retryWait: time.Second, partial: partial, holdAlerts: holdAlerts}.Querier(0, 1)
				require.NoError(t, err)
				defer func() { require.NoError(t, q.Close()) }()

				start := time.Now()
				ss := q.Select(context.Background(), false, nil, forState)
				n := 0
				for ss.Next() {
					n++
				}
				require.Equal(t, tc.wantSeries, n)
				require.Equal(t, tc.wantWait, time.Since(start))
				require.Equal(t, tc.retried, testutil.ToFloat64(partial.WithLabelValues("retried")))
				require.Equal(t, tc.failed, testutil.ToFloat64(partial.WithLabelValues("failed")))
				if tc.failed == 0 {
					require.NoError(t, ss.Err())
					return
				}
				require.ErrorIs(t, ss.Err(), query.ErrPartialData)
				require.ErrorContains(t, ss.Err(), "peer down")

				// The group's next rule: read once, no more waiting.
				start = time.Now()
				require.ErrorIs(t, q.Select(context.Background(), false, nil, forState).Err(), query.ErrPartialData)
				require.Zero(t, time.Since(start))
				require.Equal(t, tc.failed+1, testutil.ToFloat64(partial.WithLabelValues("failed")))
			})
		})
	}
}

// flakyQueryable answers one series, with a missing-data warning for the
// first partialReads reads.
type flakyQueryable struct{ partialReads int }

func (f *flakyQueryable) Querier(int64, int64) (promstorage.Querier, error) {
	var ws annotations.Annotations
	if f.partialReads > 0 {
		f.partialReads--
		ws = ws.Add(errors.New("peer down"))
	}
	s := promstorage.NewListSeries(labels.FromStrings(model.MetricNameLabel, "ALERTS_FOR_STATE", "alertname", "A"), nil)
	return &promstorage.MockQuerier{SelectMockFunction: func(bool, *promstorage.SelectHints, ...*labels.Matcher) promstorage.SeriesSet {
		return &warnedSet{readSet: readSet{series: []promstorage.Series{s}}, ws: ws}
	}}, nil
}

type warnedSet struct {
	readSet
	ws annotations.Annotations
}

func (s *warnedSet) Warnings() annotations.Annotations { return s.ws }
