package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/timestamp"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/phonehome/phonehome/query"
)

// The index calls a peer is asked, as phonehome_peers_label_calls_total
// names them (call).
const (
	callLabels = "labels" // label names and values
	callSeries = "series" // /api/v1/series
)

// IndexHandler serves the calls answered from the index, query.IndexPaths()
// (the label calls and /api/v1/series, GET and POST form as Prometheus;
// auth.Middleware with auth.PermRead in front, authenticating with
// Authenticator): a request with ScopeHeader "local" — a peer's — gets
// local's label names and values and series (query.NewIndexHandler: under
// limit, the smallest), so that peers never recurse and never read each
// other's samples to list them; any other is fleet's (the query API).
// Every answer carries InstanceHeader, by which a peer tells it from an
// earlier release's query API (apiCall.local).
func (s *Set) IndexHandler(logger *slog.Logger, fleet http.Handler, local query.Reader, ready func() bool) http.Handler {
	return s.scoped(query.NewIndexHandler(logger, local, ready), fleet)
}

// callContext is ctx for one call to the peer: its tenant (the peer
// transport's credential) and the peer timeout.
func (q *peerQuerier) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithValue(ctx, tenantKey{}, q.tenant), time.Duration(q.set.cfg.Timeout))
}

// indexCallDone counts and logs the end of call to p's index endpoint,
// made for a caller whose context is ctx, and returns its error:
// errNoIndexCalls as is (the caller reads p's series instead; counted, and
// a peer without the endpoint logged once until it serves the call again),
// any other naming p (a warning of the merge). A call that ended because
// ctx did (the caller went away, or fanOut cancelled it) is not p's
// failure: neither counted nor logged, as peerSeriesSet does for remote
// reads.
func (s *Set) indexCallDone(ctx context.Context, p *peer, call string, err error) error {
	switch {
	case err != nil && ctx.Err() != nil:
		// ctx's error, not err: an errNoIndexCalls arriving as the caller
		// leaves must not start a fallback read.
		return fmt.Errorf("peer %s: %w", p.addr, ctx.Err())
	case errors.Is(err, errIndexCallTooLarge):
		// This call only: the next small one is asked of the index again.
		s.m.labelCalls.WithLabelValues(call, "series").Inc()
		s.logger.Debug("index call too large for the peer, reading its series instead", "peer", p.addr, "call", call, "err", err)
		return err
	case errors.Is(err, errNoIndexCalls):
		s.m.labelCalls.WithLabelValues(call, "series").Inc()
		if !p.fallback[call].Swap(true) {
			s.logger.Warn("peer does not serve index calls to this replica, reading its series instead (a receiver of an earlier release?)",
				"peer", p.addr, "call", call, "err", err)
		}
		return err
	case err != nil:
		s.m.reads.WithLabelValues("error").Inc()
		s.logger.Debug("peer index call failed", "peer", p.addr, "call", call, "err", err)
		return missing(p.addr, err)
	}
	s.m.reads.WithLabelValues("success").Inc()
	s.m.labelCalls.WithLabelValues(call, "labels").Inc()
	if p.fallback[call].Swap(false) {
		s.logger.Info("peer serves index calls", "peer", p.addr, "call", call)
	}
	return nil
}

// apiParams are the API parameters of an index call over [mint, maxt]
// with matchers ms and limit (0 for none). The API's own bounds (no start
// or end given) are left out, and so is anything beyond them, which the
// API's times cannot express.
func apiParams(mint, maxt int64, limit int, ms []*labels.Matcher) url.Values {
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
	if limit > 0 {
		v.Set("limit", strconv.Itoa(limit))
	}
	return v
}
