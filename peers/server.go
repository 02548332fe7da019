package peers

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/query"
)

// Handler serves POST /api/v1/read (auth.Middleware with auth.PermRead in
// front, authenticating with Authenticator). A request with ScopeHeader
// "local" — a peer's — reads local only (head and local blocks) and is
// answered with the tenant's horizon; any other reads fleet, the same view
// as the query API (this receiver, its peers and the bucket), for a central
// Prometheus or any remote-read client. Every answer carries
// InstanceHeader. reg may be nil.
func (s *Set) Handler(logger *slog.Logger, reg prometheus.Registerer, fleet, local query.Reader, horizon func(tenant string) int64, opts query.ReadOptions) http.Handler {
	scoped := func(scope string) prometheus.Registerer {
		if reg == nil {
			return nil
		}
		return prometheus.WrapRegistererWith(prometheus.Labels{"scope": scope}, reg)
	}
	fleetH := query.NewReadHandler(logger, scoped("fleet"), fleet, opts)
	localH := query.NewReadHandler(logger, scoped("local"), local, opts)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, s.instance)
		if r.Header.Get(ScopeHeader) != ScopeLocal {
			fleetH.ServeHTTP(w, r)
			return
		}
		if id, ok := auth.FromContext(r.Context()); ok && horizon != nil {
			// Before reading: whatever is uploaded or written after this
			// is in the bucket or newer than the horizon.
			w.Header().Set(HorizonHeader, strconv.FormatInt(horizon(id.Tenant), 10))
		}
		localH.ServeHTTP(w, r)
	})
}

// Authenticator returns base extended with the replica token, for the peer
// endpoints only (remote read, pushdown, metadata, label and series calls): a request bearing the replica token reads the
// tenant named in TenantHeader, local scope only (ScopeHeader), and nothing
// else. Every other request is base's: a tenant's read token reads that
// tenant and TenantHeader is ignored, so one tenant can never name another.
func (s *Set) Authenticator(base auth.Authenticator) auth.Authenticator {
	return replicaAuth{s: s, base: base}
}

type replicaAuth struct {
	s    *Set
	base auth.Authenticator
}

func (a replicaAuth) Authenticate(r *http.Request) (auth.Identity, error) {
	tok, ok := auth.ParseBearer(r.Header.Get("Authorization"))
	if !ok || !a.s.isReplicaToken(tok) {
		return a.base.Authenticate(r)
	}
	tenant := r.Header.Get(TenantHeader)
	if !auth.ValidTenant(tenant) {
		return auth.Identity{}, fmt.Errorf("replica token without a valid %s: %w", TenantHeader, auth.ErrUnauthorized)
	}
	if r.Header.Get(ScopeHeader) != ScopeLocal {
		return auth.Identity{Tenant: tenant}, fmt.Errorf("the replica token reads local data only: %w", auth.ErrForbidden)
	}
	return auth.Identity{Tenant: tenant, Allow: auth.PermRead}, nil
}

// isReplicaToken reports whether tok is one of the replica tokens. Every
// one is compared, so the time taken does not tell which matched.
func (s *Set) isReplicaToken(tok string) bool {
	want := s.replicaToken.Load()
	if want == nil {
		return false
	}
	match := 0
	for _, w := range *want {
		match |= subtle.ConstantTimeCompare([]byte(tok), []byte(w))
	}
	return match == 1
}
