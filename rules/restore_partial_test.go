package rules

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	promrules "github.com/prometheus/prometheus/rules"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/internal/logbuf"
)

// TestForStateNotRestoredFromPartialData: the evaluator restarts after
// another replica evaluated. This replica holds an old episode of an
// alert with a 1h `for` (firing then); the other, which holds its end and
// a new activation 5 minutes ago, does not answer the restore's first
// read. Restored from that partial answer, the alert fired at once (before,
// silently). It is read again and restored from the whole answer (pending,
// 55 minutes to go); if the other replica never answers, it is not
// restored, and waits its full `for`, as after any failed restore. A rule
// holding no alert has nothing to restore: its partial reads are not
// repeated.
func TestForStateNotRestoredFromPartialData(t *testing.T) {
	for _, tc := range []struct {
		name         string
		partialReads int32
		restored     bool
		retried      float64
		failed       float64
	}{
		{name: "whole at the second read", partialReads: 1, restored: true, retried: 1},
		{name: "never whole", partialReads: 99, retried: 2, failed: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			reader := &forStateReader{fleetReader: fleetReader{local: clusterDB(t, "a"), peer: clusterDB(t, "b")}}
			reader.partialReads.Store(tc.partialReads)
			old, current := now.Add(-2*time.Hour), now.Add(-5*time.Minute)
			appendForState(t, reader.local, now.Add(-55*time.Minute), now.Add(-50*time.Minute), float64(old.Unix()))
			appendForState(t, reader.peer, now.Add(-50*time.Minute), now.Add(-49*time.Minute), float64(old.Unix()))
			appendForState(t, reader.peer, now.Add(-48*time.Minute), now.Add(-48*time.Minute), math.Float64frombits(value.StaleNaN)) // resolved
			appendForState(t, reader.peer, current, now.Add(-15*time.Second), float64(current.Unix()))

			logs := &logbuf.Buffer{}
			m, _, stop := startFleetRules(t, `groups:
- name: fleet
  rules:
  - alert: NeverFires
    expr: count(up) > 100
    for: 1h
  - alert: FleetCompleteForAnHour
    expr: count(up) >= 2
    for: 1h
`, reader, logs, "")
			eventually(t, func() bool { r := alertByName(m, "FleetCompleteForAnHour"); return r != nil && r.Restored() })
			// An evaluation after the restore, where a restored firing state shows.
			r := alertByName(m, "FleetCompleteForAnHour")
			restoredBy := r.GetEvaluationTimestamp()
			eventually(t, func() bool { return r.GetEvaluationTimestamp().After(restoredBy) })
			stop()

			require.Equal(t, promrules.StatePending, r.State(), "fired from the partial answer")
			active := r.ActiveAlerts()
			require.Len(t, active, 1)
			if tc.restored {
				require.WithinRange(t, active[0].ActiveAt, current, current.Add(time.Minute), "restored from the new activation")
			} else {
				require.False(t, active[0].ActiveAt.Before(now.Truncate(time.Second)), "not restored: the full `for` from the start")
				require.Contains(t, logs.String(), "Failed to restore 'for' state")
			}
			require.Equal(t, tc.retried, testutil.ToFloat64(m.metrics.partialRestores.WithLabelValues("retried")))
			require.Equal(t, tc.failed, testutil.ToFloat64(m.metrics.partialRestores.WithLabelValues("failed")))
		})
	}
}

// forStateReader is a fleetReader whose peer does not answer the first
// partialReads reads of FleetCompleteForAnHour's `for` state, nor any of
// NeverFires' (the evaluations read it whole).
type forStateReader struct {
	fleetReader
	partialReads atomic.Int32
}

func (r *forStateReader) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	lq, err := r.local.Querier(mint, maxt)
	if err != nil {
		return nil, err
	}
	pq, err := r.peer.Querier(mint, maxt)
	if err != nil {
		return nil, err
	}
	return promstorage.NewMergeQuerier([]promstorage.Querier{lq}, []promstorage.Querier{&forStatePeer{Querier: pq, r: r}}, promstorage.ChainedSeriesMerge), nil
}

type forStatePeer struct {
	promstorage.Querier
	r *forStateReader
}

func (p *forStatePeer) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	for _, m := range ms {
		if m.Name == labels.AlertName && (m.Value == "NeverFires" || m.Value == "FleetCompleteForAnHour" && p.r.partialReads.Add(-1) >= 0) {
			return promstorage.ErrSeriesSet(errDeadPeer)
		}
	}
	return p.Querier.Select(ctx, sortSeries, hints, ms...)
}

// appendForState writes ALERTS_FOR_STATE{alertname="FleetCompleteForAnHour"}
// = v every 15s in [from, to].
func appendForState(t *testing.T, db interface {
	Appender(context.Context) promstorage.Appender
}, from, to time.Time, v float64,
) {
	t.Helper()
	app := db.Appender(context.Background())
	ls := labels.FromStrings(model.MetricNameLabel, "ALERTS_FOR_STATE", "alertname", "FleetCompleteForAnHour")
	for ts := from; !ts.After(to); ts = ts.Add(15 * time.Second) {
		_, err := app.Append(0, ls, ts.UnixMilli(), v)
		require.NoError(t, err)
	}
	require.NoError(t, app.Commit())
}
