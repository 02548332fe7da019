package rules

import (
	"context"
	"time"

	promrules "github.com/prometheus/prometheus/rules"
)

// MaxTerminationGracePeriod is the longest graceful stop of the evaluator
// (the head flush and upload) that restartAllowance covers: a receiver's
// terminationGracePeriodSeconds must not exceed it (deploy's tests check
// every kustomization), or a rolling update outlasts the alerts sent
// before the stop and Alertmanager resolves them.
const MaxTerminationGracePeriod = 2 * time.Minute

// startAllowance is a restarted evaluator's start until its rules run: the
// pod's scheduling and container start, and the WAL replay (under 30 s at
// 1M series in bench/results; a replica is sized for 250k).
const startAllowance = time.Minute

// restartAllowance is how long a graceful restart of the evaluator may keep
// it from evaluating besides its evaluation intervals. The rule: it is at
// least the longest stop plus a start, so it is defined as their sum.
const restartAllowance = MaxTerminationGracePeriod + startAllowance

// sendBeforeStop sends every firing alert once more as the evaluator stops
// gracefully (a rolling update), valid until a restarted evaluator sends it
// again. Prometheus restores the `for` state only after the second
// evaluation after a start and so sends an alert with `for` at the third:
// with the shutdown and the start before, that came after the usual
// validity (four evaluation intervals or resend delays), and Alertmanager
// resolved every firing fleet alert and got it firing again minutes later
// on every restart. An evaluator that crashes sends nothing more; one
// stopped for good leaves the alerts to resolve that much later.
// Call it before the groups stop: the notifier's drain at its stop does
// not wait for a batch already in flight, so this one goes out while the
// groups finish (and the receiver then flushes its head, which takes
// longer still). A group that evaluates meanwhile sends what it finds:
// Alertmanager ends an alert it receives resolved, and keeps the later end
// of a firing one.
func (m *Manager) sendBeforeStop(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, tr := range m.tenants {
		for _, g := range tr.RuleGroups() {
			validUntil := now.Add(restartValidity(g.Interval(), m.resendDelay))
			for _, r := range g.Rules() {
				if ar, ok := r.(*promrules.AlertingRule); ok {
					sendCopies(ctx, tr.notify, ar, validUntil, func(a *promrules.Alert) bool { return a.State == promrules.StateFiring })
				}
			}
		}
	}
}

// restartValidity is how long the alerts sent before a graceful stop stay
// active in Alertmanager: the usual validity, and the three evaluation
// intervals and the restart allowance before a restarted evaluator sends
// them again.
func restartValidity(interval, resendDelay time.Duration) time.Duration {
	return validity(interval, resendDelay) + 3*interval + restartAllowance
}
