package limits

import (
	"strings"
	"time"
)

// InFlightRetryAfter is the Retry-After of a request refused by
// max_inflight_requests_per_cluster: the requests it waited for are usually
// answered well within it.
const InFlightRetryAfter = time.Second

// InFlight is a write request counted by StartRequest. Call Done exactly
// once when the request has been answered (the zero InFlight's Done does
// nothing).
type InFlight struct {
	t       *tenant
	cluster string
}

// StartRequest counts a write request of cluster as in flight until Done.
// If the cluster already has max_inflight_requests_per_cluster requests in
// flight, it counts nothing and returns a *LimitError (ErrRateLimited): the
// receiver answers 429 with Retry-After (InFlightRetryAfter) before reading
// the body, so one cluster cannot occupy every handler and every request
// buffer of a replica, whatever the number of its connections.
//
// Requests are counted whatever the limit (also when unlimited), so a
// reloaded limit applies at once to the requests in flight: after lowering
// it, a cluster is refused until enough of them have finished. A credential
// not bound to a cluster (cluster "") is not limited.
func (l *Limiter) StartRequest(tenant, cluster string) (InFlight, error) {
	if cluster == "" {
		return InFlight{}, nil
	}
	limit := l.cfg.Load().forTenant(tenant).MaxInflightRequestsPerCluster
	t := l.tenant(tenant)
	t.inflightMu.Lock()
	n := t.inflight[cluster]
	if limit > 0 && n >= limit {
		t.inflightMu.Unlock()
		return InFlight{}, l.reject(LimitInflightRequestsPerCluster, float64(limit))
	}
	if n == 0 {
		cluster = strings.Clone(cluster) // retained as a map key
	}
	t.inflight[cluster] = n + 1
	t.inflightMu.Unlock()
	return InFlight{t: t, cluster: cluster}, nil
}

// Done ends the request.
func (f InFlight) Done() {
	if f.t == nil {
		return
	}
	f.t.inflightMu.Lock()
	defer f.t.inflightMu.Unlock()
	if n := f.t.inflight[f.cluster]; n > 1 {
		f.t.inflight[f.cluster] = n - 1
	} else {
		delete(f.t.inflight, f.cluster)
	}
}
