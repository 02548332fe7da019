package rules

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	promrules "github.com/prometheus/prometheus/rules"
)

// activeRules knows, after each evaluation of each group, which of its
// alerting rules hold alerts: the only ones whose `for` state a restore
// applies to (Prometheus' RestoreForState, right after an evaluation, in
// the same goroutine). Safe for concurrent use.
type activeRules struct {
	mu      sync.Mutex
	byGroup map[string][]string // group key → names of its alerting rules with alerts
}

// track wraps a group's evaluation with the update of what it holds.
func (a *activeRules) track(iterate promrules.GroupEvalIterationFunc) promrules.GroupEvalIterationFunc {
	return func(ctx context.Context, g *promrules.Group, ts time.Time) {
		iterate(ctx, g, ts)
		var names []string
		for _, r := range g.Rules() {
			if ar, ok := r.(*promrules.AlertingRule); ok && ar.ActiveAlertsCount() > 0 {
				names = append(names, ar.Name())
			}
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.byGroup == nil {
			a.byGroup = map[string][]string{}
		}
		a.byGroup[promrules.GroupKey(g.File(), g.Name())] = names
	}
}

// holdAlerts reports whether the rule a restore selects by ms (its alert
// name and labels) may hold alerts: true unless no rule of that name does.
func (a *activeRules) holdAlerts(ms []*labels.Matcher) bool {
	name := ""
	for _, m := range ms {
		if m.Name == labels.AlertName && m.Type == labels.MatchEqual {
			name = m.Value
		}
	}
	if name == "" {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, names := range a.byGroup {
		if slices.Contains(names, name) {
			return true
		}
	}
	return false
}
