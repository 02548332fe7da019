package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/timestamp"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/phonehome/phonehome/query"
)

// truncatedWarning is the warning Prometheus' label handlers add when they
// cut an answer at limit. A peer's is not passed on: the querier asks it for
// the caller's limit, and the API that asked warns itself if the merge is
// over its own.
const truncatedWarning = "results truncated due to limit"

// LabelsHandler serves the label calls, query.LabelNamesPath and
// query.LabelValuesPath (auth.Middleware with auth.PermRead in front,
// authenticating with Authenticator): a request with ScopeHeader "local" —
// a peer's — gets local's label names and values (query.NewLabelHandler:
// under limit, the smallest), so that peers never recurse and never read
// each other's series to list labels; any other is fleet's (the query API).
// Every answer carries InstanceHeader.
func (s *Set) LabelsHandler(logger *slog.Logger, fleet http.Handler, local query.Reader, ready func() bool) http.Handler {
	return s.scoped(query.NewLabelHandler(logger, local, ready), fleet)
}

// errNoLabelCalls means a peer refused its label endpoint to this replica in
// a way a receiver of the previous release does (which has none for peers):
// 404 or 405, or 401 or 403 (it does not take the replica token there). The
// querier then reads the peer's series instead; if the credential is
// really wrong, that read fails too and is the warning.
var errNoLabelCalls = errors.New("peer has no label endpoint")

// LabelValues asks the peer for its values of name (labelCall); a peer
// without the endpoint is read through its series.
func (q *peerQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	esc := name
	if !model.LegacyValidation.IsValidLabelName(name) || strings.HasPrefix(name, "U__") {
		esc = model.EscapeName(name, model.ValueEncodingEscaping) // as the API unescapes it
	}
	vals, ws, err := q.labelCall(ctx, "/api/v1/label/"+url.PathEscape(esc)+"/values", hints, ms)
	if !errors.Is(err, errNoLabelCalls) {
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
	if !errors.Is(err, errNoLabelCalls) {
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
// the endpoint is errNoLabelCalls, counted and logged once.
func (q *peerQuerier) labelCall(ctx context.Context, path string, hints *promstorage.LabelHints, ms []*labels.Matcher) ([]string, annotations.Annotations, error) {
	ctx = context.WithValue(ctx, tenantKey{}, q.tenant)
	ctx, cancel := context.WithTimeout(ctx, time.Duration(q.set.cfg.Timeout))
	defer cancel()
	p, s := q.peer, q.set
	vals, ws, err := s.getLabels(ctx, p, path, labelParams(q.mint, q.maxt, hints, ms))
	switch {
	case errors.Is(err, errNoLabelCalls):
		s.m.labelCalls.WithLabelValues("series").Inc()
		if !p.labelFallback.Swap(true) {
			s.logger.Warn("peer does not serve label calls to this replica, reading its series instead (a receiver of the previous release?)",
				"peer", p.addr, "err", err)
		}
		return nil, nil, err
	case err != nil:
		s.m.reads.WithLabelValues("error").Inc()
		s.logger.Debug("peer label call failed", "peer", p.addr, "err", err)
		return nil, nil, fmt.Errorf("peer %s unavailable, its data is missing: %w", p.addr, err)
	}
	s.m.reads.WithLabelValues("success").Inc()
	s.m.labelCalls.WithLabelValues("labels").Inc()
	if p.labelFallback.Swap(false) {
		s.logger.Info("peer serves label calls", "peer", p.addr)
	}
	if hints != nil && hints.Limit > 0 && len(vals) > hints.Limit {
		vals = vals[:hints.Limit]
	}
	return vals, ws, nil
}

// labelParams are the API parameters of a label call over [mint, maxt].
// The API's own bounds (no start or end given) are left out, and so is
// anything beyond them, which the API's times cannot express.
func labelParams(mint, maxt int64, hints *promstorage.LabelHints, ms []*labels.Matcher) url.Values {
	v := url.Values{}
	if len(ms) > 0 {
		sel := make([]string, len(ms))
		for i, m := range ms {
			sel[i] = m.String()
		}
		v.Set("match[]", "{"+strings.Join(sel, ",")+"}")
	}
	// Seconds with milliseconds, which the API reads back exactly.
	if mint > timestamp.FromTime(v1.MinTime) {
		v.Set("start", strconv.FormatFloat(float64(mint)/1000, 'f', 3, 64))
	}
	if maxt < timestamp.FromTime(v1.MaxTime) {
		v.Set("end", strconv.FormatFloat(float64(maxt)/1000, 'f', 3, 64))
	}
	if hints != nil && hints.Limit > 0 {
		v.Set("limit", strconv.Itoa(hints.Limit))
	}
	return v
}

// getLabels calls the peer's label endpoint at path and returns its sorted,
// distinct values and its warnings (truncatedWarning left out).
func (s *Set) getLabels(ctx context.Context, p *peer, path string, params url.Values) ([]string, annotations.Annotations, error) {
	// GET: Prometheus serves label values on GET only.
	out, err := getAPI[[]string](ctx, s, p, path, params)
	var se *statusError
	if errors.As(err, &se) {
		switch se.code {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnauthorized, http.StatusForbidden:
			return nil, nil, fmt.Errorf("%w: %w", errNoLabelCalls, err)
		}
	}
	if err != nil {
		return nil, nil, err
	}
	var ws annotations.Annotations
	for _, w := range out.Warnings {
		if w != truncatedWarning {
			ws.Add(fmt.Errorf("peer %s: %s", p.addr, w))
		}
	}
	for _, i := range out.Infos {
		ws.Add(fmt.Errorf("peer %s: %s: %w", p.addr, i, annotations.PromQLInfo))
	}
	// The merge needs them sorted and distinct; Prometheus' handlers send
	// them so, and a peer is not trusted to.
	slices.Sort(out.Data)
	return slices.Compact(out.Data), ws, nil
}
