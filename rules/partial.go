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

// errSkipped marks a rule evaluation skipped because its query read partial
// data.
var errSkipped = errors.New("evaluation skipped")

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
//
// Prometheus does not send a rule's alerts when its evaluation fails, and
// Alertmanager resolves an alert that has not been sent for four evaluation
// intervals or resend delays: resendSkipped sends them as the evaluation
// would have.
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
			return nil, fmt.Errorf("%w: %w", errSkipped, err)
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

// resendSkipped is the group's evaluation, then, for every alerting rule that
// skipped it, what the evaluation would have sent: its firing alerts (and
// those resolved since they were last sent), once per resend delay, valid
// for four evaluation intervals or resend delays, as Prometheus' own
// AlertingRule.sendAlerts does. While a peer stays unreachable for longer
// than that, a firing fleet alert then stays firing in Alertmanager instead of
// resolving and firing again once the data is whole. Pending alerts are not
// sent, as by Prometheus.
//
// Unlike Prometheus, the validity counts from the send, not from the
// iteration's scheduled time ts, and adds the time the iteration took: a
// slow peer (one that answers /-/ready but no read before peers.timeout)
// makes every rule of the group wait for it, so an iteration can outlast the
// validity, and the next send comes only after the next iteration. Counted
// from ts, the alert would reach Alertmanager expired and be resolved there
// until the peer is fast again.
func resendSkipped(notify promrules.NotifyFunc, resendDelay time.Duration) promrules.GroupEvalIterationFunc {
	return func(ctx context.Context, g *promrules.Group, ts time.Time) {
		promrules.DefaultEvalIterationFunc(ctx, g, ts)
		now := time.Now()
		validUntil := now.Add(validity(g.Interval(), resendDelay) + max(now.Sub(ts), 0))
		for _, r := range g.Rules() {
			ar, ok := r.(*promrules.AlertingRule)
			if !ok || !errors.Is(ar.LastError(), errSkipped) {
				continue
			}
			sendCopies(ctx, notify, ar, validUntil, func(a *promrules.Alert) bool {
				if a.State == promrules.StatePending ||
					!a.ResolvedAt.After(a.LastSentAt) && !a.LastSentAt.Add(resendDelay).Before(ts) {
					return false
				}
				a.LastSentAt, a.ValidUntil = ts, validUntil
				return true
			})
		}
	}
}

// validity is how long a sent alert stays active in Alertmanager: four
// evaluation intervals or resend delays, whichever is longer, as Prometheus'
// AlertingRule.sendAlerts sets it.
func validity(interval, resendDelay time.Duration) time.Duration {
	return 4 * max(interval, resendDelay)
}

// sendCopies sends copies of ar's active alerts that pick chooses, valid
// until validUntil. Copies: the notifier modifies its alerts' labels.
func sendCopies(ctx context.Context, notify promrules.NotifyFunc, ar *promrules.AlertingRule, validUntil time.Time, pick func(*promrules.Alert) bool) {
	var alerts []*promrules.Alert
	ar.ForEachActiveAlert(func(a *promrules.Alert) {
		if !pick(a) {
			return
		}
		sent := *a
		sent.Labels = a.Labels.Copy()
		sent.ValidUntil = validUntil
		alerts = append(alerts, &sent)
	})
	if len(alerts) > 0 {
		notify(ctx, ar.Query().String(), alerts...)
	}
}
