package deploy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/rules"
)

// TestReceiverGracePeriodWithinRulesRestartAllowance: the alerts the rules
// evaluator sends as it stops stay valid through a stop as long as
// rules.MaxTerminationGracePeriod and a start; a receiver given a longer
// terminationGracePeriodSeconds (a base or overlay change) could be still
// stopping when they expire, and Alertmanager resolves them on every
// rolling update.
func TestReceiverGracePeriodWithinRulesRestartAllowance(t *testing.T) {
	checked := 0
	for _, oc := range ourContainers(t) {
		if oc.binary != "receiver" {
			continue
		}
		grace := 30 * time.Second // Kubernetes' default
		if s := oc.pt.Spec.TerminationGracePeriodSeconds; s != nil {
			grace = time.Duration(*s) * time.Second
		}
		require.LessOrEqual(t, grace, rules.MaxTerminationGracePeriod, "%s: terminationGracePeriodSeconds", oc)
		checked++
	}
	require.NotZero(t, checked, "no receiver found")
}
