package receive

import (
	"strings"

	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
)

// admit decides whether one series may be stored: it must be valid, bound to
// the caller's cluster, inside the server-side allowlist (and its tenant's gathering definition), and fit the series
// limits. It rewrites ts in place (labels sorted, empty and elided labels removed, _id added).
// It returns the series' key and the hint the limiter keeps for it (its head
// reference, see hintedWriter).
func (h *Handler) admit(ts *prompb.TimeSeries, id auth.Identity, lim *limits.TenantLimits, pol *Policy, sess *sessions) (limits.Key, uint64, *seriesError) {
	name, resorted, serr := validateSeries(ts, lim, id, h.opts.OverwriteClusterID)
	if resorted && serr == nil {
		h.metrics.unsortedSeries.Inc()
	}
	if serr != nil {
		return limits.Key{}, 0, serr
	}
	ts.Labels = pol.elideLabels(ts.Labels)
	if !pol.allows(id.Tenant, ts.Labels) {
		return limits.Key{}, 0, &seriesError{reasonAllowlist, "series is not in the server-side allowlist"}
	}
	s := sess.get(h.limiter, id.Tenant, clusterOf(ts.Labels))
	key := seriesKey(ts.Labels)
	hint, err := s.AdmitKey(name, key)
	if err != nil {
		return limits.Key{}, 0, &seriesError{reasonSeriesLimit, "new series refused: " + err.Error()}
	}
	tracked(s, name, ts) // status page (track.go)
	return key, hint, nil
}

// sessions holds the limiter sessions of one request, one per cluster. A
// request nearly always carries one cluster, so a slice beats a map.
type sessions struct {
	clusters []string
	s        []*limits.Session
}

// errErased refuses a series of an erased cluster (Options.Denied).
var errErased = &seriesError{reasonErased, storage.ClusterErasedRefusal}

// errErasedCredential refuses a whole request of a credential bound to an
// erased cluster, before its body is read: a 400, as its series would be.
var errErasedCredential = &rejectedError{msg: "nothing was written: " + storage.ClusterErasedRefusal}

// denial returns the test of a request's series against the deny list
// (Options.Denied), run before admit so that an erased cluster leaves no
// trace in the limiter: asked once for a credential bound to a cluster,
// per run of series of one _id for a credential bound to none; nil when
// there is nothing to refuse. (Kept out of admit: inlined there, it slowed
// every series by ~10 %, BenchmarkHandlerV2.)
func (h *Handler) denial(id auth.Identity) func(*prompb.TimeSeries) bool {
	isDenied := h.opts.Denied
	switch {
	case isDenied == nil:
		return nil
	case id.ClusterID != "":
		if isDenied(id.Tenant, id.ClusterID) {
			return func(*prompb.TimeSeries) bool { return true }
		}
		return nil
	}
	var last string
	var lastDenied, known bool
	return func(ts *prompb.TimeSeries) bool {
		if c := clusterOf(ts.Labels); !known || c != last {
			last, lastDenied, known = strings.Clone(c), isDenied(id.Tenant, c), true
		}
		return lastDenied
	}
}

func (ss *sessions) get(l *limits.Limiter, tenant, cluster string) *limits.Session {
	for i, c := range ss.clusters {
		if c == cluster {
			return ss.s[i]
		}
	}
	s := l.Session(tenant, cluster)
	ss.clusters = append(ss.clusters, cluster)
	ss.s = append(ss.s, &s)
	return &s
}
