package deploy

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/phonehome/phonehome/push"
)

// promqlParser parses as the receiver's rules do.
var promqlParser = parser.NewParser(parser.Options{})

// pushSeriesNames are the series the push endpoint writes for its default
// metrics (a histogram as _bucket, _sum and _count too).
func pushSeriesNames() map[string]bool {
	out := map[string]bool{}
	for _, n := range push.DefaultAllowedMetrics {
		for _, s := range []string{"", "_bucket", "_sum", "_count"} {
			out[n+s] = true
		}
	}
	return out
}

// partialSumProblem says why expr would not give the exact total of push
// series written by several receiver replicas (each its partial sum, told
// apart by push.ReplicaLabel), or "" if it does: every selector of a push
// series must sit directly under a sum that drops the replica label. Any
// other aggregation first (count, max, topk, ...) or none at all would count
// or pick partials instead of adding them.
func partialSumProblem(expr string) (string, error) {
	e, err := promqlParser.ParseExpr(expr)
	if err != nil {
		return "", err
	}
	names := pushSeriesNames()
	var problem string
	parser.Inspect(e, func(node parser.Node, path []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok || problem != "" || !names[vs.Name] {
			return nil
		}
		for i := len(path) - 1; i >= 0; i-- {
			agg, ok := path[i].(*parser.AggregateExpr)
			if !ok {
				continue
			}
			keeps := slices.Contains(agg.Grouping, push.ReplicaLabel) != agg.Without
			switch {
			case agg.Op != parser.SUM:
				problem = vs.String() + " is aggregated by " + agg.Op.String() + " before the replicas' partial sums are added"
			case keeps:
				problem = vs.String() + " is summed keeping " + push.ReplicaLabel
			}
			return nil
		}
		problem = vs.String() + " is not summed over " + push.ReplicaLabel
		return nil
	})
	return problem, nil
}

func TestPartialSumProblem(t *testing.T) {
	for _, tc := range []struct {
		expr string
		ok   bool
	}{
		{`sum(cluster_installation_invocation)`, true},
		{`sum by (platform, version) (cluster_installation_invocation{result="success"}) / on (platform, version) sum by (platform, version) (cluster_installation_invocation)`, true},
		{`sum without (push_replica) (cluster_installation_invocation)`, true},
		{`sum by (le) (rate(cluster_installation_duration_seconds_bucket[1h]))`, true},
		{`count(sum by (platform) (cluster_installation_invocation))`, true},
		{`up`, true},
		{`cluster_installation_invocation`, false},
		{`count(cluster_installation_invocation)`, false},
		{`sum(max by (platform) (cluster_installation_invocation))`, false},
		{`sum by (platform, push_replica) (cluster_installation_invocation)`, false},
		{`sum without (platform) (cluster_installation_invocation)`, false},
		{`sum(cluster_installation_invocation) / cluster_installation_invocation`, false},
	} {
		p, err := partialSumProblem(tc.expr)
		require.NoError(t, err)
		require.Equal(t, tc.ok, p == "", "%s: %s", tc.expr, p)
	}
}

// TestPushSeriesSummedOverReplicas: every shipped rule and dashboard query
// over push series adds up the replicas' partial sums, so it gives the
// fleet's total however pushes were spread over the replicas.
func TestPushSeriesSummedOverReplicas(t *testing.T) {
	exprs := map[string]string{} // expr -> where
	for _, rf := range globs(t, "rules/*.yaml", "prometheus/*.yaml") {
		var f struct {
			Groups []struct {
				Rules []struct {
					Record string `yaml:"record"`
					Alert  string `yaml:"alert"`
					Expr   string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		}
		b, err := os.ReadFile(rf)
		require.NoError(t, err)
		require.NoError(t, yaml.Unmarshal(b, &f), rf)
		for _, g := range f.Groups {
			for _, r := range g.Rules {
				exprs[r.Expr] = rf + ": " + r.Record + r.Alert
			}
		}
	}
	for _, df := range globs(t, "grafana/dashboards/*.json") {
		b, err := os.ReadFile(df)
		require.NoError(t, err)
		var d any
		require.NoError(t, json.Unmarshal(b, &d), df)
		collectExprs(d, func(e string) { exprs[e] = df })
	}
	pushExprs := 0
	names := pushSeriesNames()
	for e, where := range exprs {
		p, err := partialSumProblem(e)
		if err != nil { // a Grafana template variable; none of them reads push series
			continue
		}
		require.Empty(t, p, "%s: %s", where, e)
		parsed, _ := promqlParser.ParseExpr(e)
		for _, vs := range parser.ExtractSelectors(parsed) {
			for _, m := range vs {
				if m.Name == "__name__" && names[m.Value] {
					pushExprs++
				}
			}
		}
	}
	require.GreaterOrEqual(t, pushExprs, 3, "the installation rules and the dashboard panel read push series")
}

// collectExprs calls fn with every "expr" string of a dashboard.
func collectExprs(v any, fn func(string)) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "expr" {
				fn(s)
				continue
			}
			collectExprs(x, fn)
		}
	case []any:
		for _, x := range v {
			collectExprs(x, fn)
		}
	}
}
