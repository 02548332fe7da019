package rules

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	promrules "github.com/prometheus/prometheus/rules"
	promstorage "github.com/prometheus/prometheus/storage"

	"github.com/phonehome/phonehome/query"
)

// queryFunc is promrules.EngineQueryFunc, except that an answer known to
// lack data (query.MissingData: a peer unavailable, a bucket block not
// fetched) is an error rather than a result. A fleet query then still
// answers with the rest, which would record a wrong count for good, resolve
// alerts that count clusters (restarting their `for` timers when they come
// back) or fire ClusterGoneSilent for every cluster of an unreachable peer.
// With the error the group skips the rule for this evaluation: nothing is
// recorded (no stale marker either), and alerts keep their state, as
// Prometheus keeps them when a rule's query fails. PromQL's own
// annotations (e.g. "possible non-counter") do not count.
//
// The group logs the error at Warn once per rule evaluation ("Evaluating
// rule failed", with tenant, group and rule) and counts it in
// prometheus_rule_evaluation_failures_total; it is not logged here again.
func (m *Manager) queryFunc(q promstorage.Queryable) promrules.QueryFunc {
	return func(ctx context.Context, qs string, t time.Time) (promql.Vector, error) {
		qry, err := m.engine.NewInstantQuery(ctx, q, nil, qs, t)
		if err != nil {
			return nil, err
		}
		defer qry.Close()
		res := qry.Exec(ctx)
		if res.Err != nil {
			return nil, res.Err
		}
		if err := query.MissingData(res.Warnings); err != nil {
			m.metrics.partial.Inc()
			return nil, fmt.Errorf("evaluation skipped: %w", err)
		}
		switch v := res.Value.(type) {
		case promql.Vector:
			return v, nil
		case promql.Scalar:
			return promql.Vector{promql.Sample{T: v.T, F: v.V, Metric: labels.EmptyLabels()}}, nil
		default:
			return nil, errors.New("rule result is not a vector or scalar")
		}
	}
}
