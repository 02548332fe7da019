package pushdown

import (
	"fmt"
	"slices"

	"github.com/prometheus/prometheus/promql/parser"
)

// A part is a subexpression evaluated on every shard rather than over the
// merged fleet: each shard's answer covers only its own clusters.
type part struct {
	name string // the synthetic metric the outer query selects it by
	expr string
	// combine: the shards' partial aggregates are combined by the outer
	// aggregation, and each shard's series carry ShardLabel. Otherwise the
	// shards' series are disjoint and their union is the answer.
	combine bool
}

// ShardLabel tells apart the partial aggregates of different shards until
// the outer aggregation drops it.
const ShardLabel = "__pushdown_shard__"

// plan rewrites expr for a sharded evaluation: every maximal subexpression
// whose series each depend on one cluster only ("cluster-local") is
// replaced by a selector of its union over the shards, and every sum,
// count, min, max or group over a cluster-local expression by the same
// aggregation (sum for count) over the shards' partial aggregates. It
// returns expr unchanged and no parts when nothing can be pushed down.
//
// This is exact when each cluster's series are on one shard only, which the
// caller checks with the cluster keys the shards report.
func plan(expr parser.Expr, clusterLabel string) (parser.Expr, []part) {
	p := planner{label: clusterLabel}
	out := p.rewrite(expr)
	return out, p.parts
}

type planner struct {
	label string
	parts []part
}

func (p *planner) add(e parser.Expr, combine bool) *parser.VectorSelector {
	name := fmt.Sprintf("__pushdown_%d__", len(p.parts))
	p.parts = append(p.parts, part{name: name, expr: e.String(), combine: combine})
	return &parser.VectorSelector{Name: name, LabelMatchers: nil}
}

// combineOp is the aggregation that combines the shards' partial results of
// op, for the decomposable aggregations.
var combineOp = map[parser.ItemType]parser.ItemType{
	parser.SUM:   parser.SUM,
	parser.COUNT: parser.SUM,
	parser.MIN:   parser.MIN,
	parser.MAX:   parser.MAX,
	parser.GROUP: parser.GROUP,
}

func (p *planner) rewrite(e parser.Expr) parser.Expr {
	if e.Type() == parser.ValueTypeVector && hasSelector(e) && p.local(e) {
		return p.add(e, false)
	}
	switch n := e.(type) {
	case *parser.AggregateExpr:
		if op, ok := combineOp[n.Op]; ok && n.Param == nil && hasSelector(n.Expr) && p.local(n.Expr) {
			grouping := n.Grouping
			if n.Without {
				grouping = append(slices.Clone(grouping), ShardLabel)
			}
			return &parser.AggregateExpr{Op: op, Expr: p.add(n, true), Grouping: grouping, Without: n.Without}
		}
		n.Expr = p.rewrite(n.Expr)
		if n.Param != nil {
			n.Param = p.rewrite(n.Param)
		}
	case *parser.BinaryExpr:
		n.LHS, n.RHS = p.rewrite(n.LHS), p.rewrite(n.RHS)
	case *parser.Call:
		if readsMatchers[n.Func.Name] {
			break // its argument's matchers are its answer's labels: evaluated merged
		}
		for i, a := range n.Args {
			n.Args[i] = p.rewrite(a)
		}
	case *parser.ParenExpr:
		n.Expr = p.rewrite(n.Expr)
	case *parser.UnaryExpr:
		n.Expr = p.rewrite(n.Expr)
		// *parser.SubqueryExpr: its inner expression is evaluated at the
		// subquery's own steps, not the query's: not descended.
	}
	return e
}

// local reports whether every series e yields depends on the series of one
// cluster only (one value of the cluster label, the absent value included):
// per-series functions, and aggregations and vector matchings that keep the
// cluster label apart.
func (p *planner) local(e parser.Expr) bool {
	switch n := e.(type) {
	case *parser.NumberLiteral, *parser.StringLiteral, *parser.VectorSelector, *parser.MatrixSelector:
		return true
	case *parser.ParenExpr:
		return p.local(n.Expr)
	case *parser.UnaryExpr:
		return p.local(n.Expr)
	case *parser.StepInvariantExpr:
		return p.local(n.Expr)
	case *parser.SubqueryExpr:
		return p.local(n.Expr)
	case *parser.Call:
		return p.localCall(n)
	case *parser.AggregateExpr:
		if n.Param != nil && hasSelector(n.Param) {
			return false
		}
		return slices.Contains(n.Grouping, p.label) != n.Without && p.local(n.Expr)
	case *parser.BinaryExpr:
		l, r := n.LHS.Type(), n.RHS.Type()
		switch {
		case l == parser.ValueTypeVector && r == parser.ValueTypeVector:
			m := n.VectorMatching
			keeps := m == nil || slices.Contains(m.MatchingLabels, p.label) == m.On
			return keeps && p.local(n.LHS) && p.local(n.RHS)
		case l == parser.ValueTypeVector:
			return p.local(n.LHS) && !hasSelector(n.RHS)
		case r == parser.ValueTypeVector:
			return p.local(n.RHS) && !hasSelector(n.LHS)
		default:
			return !hasSelector(n)
		}
	}
	return false
}

func (p *planner) localCall(n *parser.Call) bool {
	if !perSeries[n.Func.Name] {
		return false
	}
	if len(n.Args) == 0 {
		// hour(), minute(), ... default to vector(time()): one series
		// without labels, on every shard.
		return n.Func.ReturnType != parser.ValueTypeVector
	}
	if (n.Func.Name == "label_replace" || n.Func.Name == "label_join") && len(n.Args) > 1 {
		if dst, ok := n.Args[1].(*parser.StringLiteral); !ok || dst.Val == p.label {
			return false
		}
	}
	for _, a := range n.Args {
		switch a.Type() {
		case parser.ValueTypeVector, parser.ValueTypeMatrix:
			if !p.local(a) {
				return false
			}
		default: // scalar and string arguments must not depend on data
			if hasSelector(a) {
				return false
			}
		}
	}
	return true
}

// perSeries are the functions whose output series each depend on one input
// series, or (histogram_quantile and friends over classic buckets) on
// series that differ only in le. Others — absent, scalar, vector, info and
// any function added later — are evaluated over the merged fleet. So are
// sort, sort_desc and sort_by_label(_desc): per series, but their answer is
// an order, which a union of the shards' parts would not keep.
var perSeries = map[string]bool{}

// readsMatchers are the functions whose answer takes its labels from their
// argument's selector: their argument is not replaced by a pushed-down part
// (a selector without matchers), it is evaluated merged.
var readsMatchers = map[string]bool{"absent": true, "absent_over_time": true}

func init() {
	for _, f := range []string{
		"abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time", "ceil", "changes",
		"clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time", "days_in_month",
		"day_of_month", "day_of_week", "day_of_year", "deg", "delta", "deriv", "exp", "first_over_time",
		"floor", "histogram_avg", "histogram_count", "histogram_sum", "histogram_stddev",
		"histogram_stdvar", "histogram_fraction", "histogram_quantile", "double_exponential_smoothing",
		"hour", "idelta", "increase", "irate", "label_replace", "label_join", "last_over_time", "ln",
		"log10", "log2", "mad_over_time", "max_over_time", "min_over_time", "minute", "month", "pi",
		"predict_linear", "present_over_time", "quantile_over_time", "rad", "rate", "resets", "round",
		"sgn", "sin", "sinh", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "year",
	} {
		perSeries[f] = true
	}
}

func hasSelector(e parser.Expr) bool {
	found := false
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if _, ok := n.(*parser.VectorSelector); ok {
			found = true
		}
		return nil
	})
	return found
}
