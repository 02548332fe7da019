package receive

import (
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
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
	if sess.denied(h.opts.Denied, id.Tenant, clusterOf(ts.Labels)) { // before the limiter: an erased cluster leaves no trace there
		return limits.Key{}, 0, &seriesError{reasonErased, "cluster was erased and is denied until re-admitted"}
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

	// The last cluster checked against the deny list, and the answer.
	denyChecked, lastDenied bool
	lastDenyCluster         string
}

// denied reports whether cluster is erased and denied (Options.Denied),
// asking once per run of series of the same cluster.
func (ss *sessions) denied(isDenied func(tenant, cluster string) bool, tenant, cluster string) bool {
	if isDenied == nil {
		return false
	}
	if !ss.denyChecked || cluster != ss.lastDenyCluster {
		ss.denyChecked, ss.lastDenyCluster, ss.lastDenied = true, cluster, isDenied(tenant, cluster)
	}
	return ss.lastDenied
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
