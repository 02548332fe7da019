package peers

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/phonehome/phonehome/query"
)

// LabelValues asks the peer for its values of name (labelCall); a peer
// without the endpoint is read through its series.
func (q *peerQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	esc := name
	if !model.LegacyValidation.IsValidLabelName(name) || strings.HasPrefix(name, "U__") {
		esc = model.EscapeName(name, model.ValueEncodingEscaping) // as the API unescapes it
	}
	vals, ws, err := q.labelCall(ctx, "/api/v1/label/"+url.PathEscape(esc)+"/values", hints, ms)
	if !errors.Is(err, errNoIndexCalls) {
		return vals, ws, err
	}
	seen := map[string]struct{}{}
	ws, err = q.eachSeries(ctx, ms, func(ls labels.Labels) {
		if v := ls.Get(name); v != "" {
			seen[v] = struct{}{}
		}
	})
	return sortedLimited(seen, hints), ws, err
}

// LabelNames asks the peer for its label names (labelCall); a peer without
// the endpoint is read through its series.
func (q *peerQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	names, ws, err := q.labelCall(ctx, query.LabelNamesPath, hints, ms)
	if !errors.Is(err, errNoIndexCalls) {
		return names, ws, err
	}
	seen := map[string]struct{}{}
	ws, err = q.eachSeries(ctx, ms, func(ls labels.Labels) {
		ls.Range(func(l labels.Label) { seen[l.Name] = struct{}{} })
	})
	return sortedLimited(seen, hints), ws, err
}

// labelCall asks the peer's label endpoint at path, with local scope and
// the tenant's credential (the peer transport), for the querier's range,
// ms and hints.Limit: the smallest hints.Limit of its own, sorted. A peer
// that fails is an error naming it (a warning of the merge); one without
// the endpoint, or a call too large for it, is errNoIndexCalls
// (indexCallDone).
func (q *peerQuerier) labelCall(ctx context.Context, path string, hints *promstorage.LabelHints, ms []*labels.Matcher) ([]string, annotations.Annotations, error) {
	callCtx, cancel := q.callContext(ctx)
	defer cancel()
	limit := 0
	if hints != nil {
		limit = hints.Limit
	}
	var vals []string
	env, err := callAPI(callCtx, q.set, q.peer, apiCall{
		path: path, params: apiParams(q.mint, q.maxt, limit, ms), local: true,
		// A form, so that a large match[] fits, where Prometheus takes one:
		// label values are GET only (a match[] too long for the URL is
		// errIndexCallTooLarge).
		post: path == query.LabelNamesPath,
	}, func(d *json.Decoder) error { return d.Decode(&vals) })
	if err := q.set.indexCallDone(ctx, q.peer, callLabels, refused(err)); err != nil {
		return nil, nil, err
	}
	// The merge needs them sorted and distinct; Prometheus' handlers send
	// them so, and a peer is not trusted to.
	slices.Sort(vals)
	vals = slices.Compact(vals)
	if limit > 0 && len(vals) > limit {
		vals = vals[:limit]
	}
	return vals, env.annotations(q.peer), nil
}
