package rules

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEvaluatorReplica: with rules.evaluator_replica, the replica whose
// storage.external_labels.replica equals it evaluates and the others do
// not, from one shared configuration; it is refused beside rules.evaluate
// and without a replica label. rules.evaluate alone keeps its meaning.
func TestEvaluatorReplica(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		name             string
		evaluate         *bool
		evaluatorReplica string
		replica          string
		files            []string
		evaluates        bool
		err              string
	}{
		{name: "named replica", evaluatorReplica: "phonehome-receiver-0", replica: "phonehome-receiver-0", evaluates: true},
		{name: "another replica", evaluatorReplica: "phonehome-receiver-0", replica: "phonehome-receiver-1"},
		{name: "prefix is not equal", evaluatorReplica: "phonehome-receiver-1", replica: "phonehome-receiver-10"},
		{name: "no rule files", evaluatorReplica: "r0", replica: "r0", files: []string{}},
		{name: "with evaluate", evaluatorReplica: "r0", replica: "r0", evaluate: &on, err: "rules.evaluator_replica: set together with rules.evaluate"},
		{name: "with evaluate false", evaluatorReplica: "r0", replica: "r0", evaluate: &off, err: "rules.evaluator_replica: set together with rules.evaluate"},
		{name: "without replica label", evaluatorReplica: "r0", err: `rules.evaluator_replica: "r0", but storage.external_labels.replica is not set`},
		{name: "evaluate default", replica: "r1", evaluates: true},
		{name: "evaluate false", replica: "r0", evaluate: &off},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Files: []string{"rules/*.yaml"}, Evaluate: tc.evaluate, EvaluatorReplica: tc.evaluatorReplica}
			if tc.files != nil {
				cfg.Files = tc.files
			}
			cfg.SetReplica(tc.replica)
			cfg.SetDefaults()
			err := cfg.Validate()
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.evaluates, cfg.Evaluates())
		})
	}
}
