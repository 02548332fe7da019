// Package auth authenticates receiver requests and carries the caller's
// identity (tenant and, optionally, a bound cluster id) in the request context.
// Identity is never taken from client-supplied tenant headers.
package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// ErrUnauthorized means the request carried no valid credential.
var ErrUnauthorized = errors.New("unauthorized")

// Identity is who a request acts for. Tenant is never empty for an
// authenticated request. ClusterID, when set, binds every series the caller
// writes to that `_id`.
type Identity struct {
	Tenant    string
	ClusterID string
	// ClusterIDAlias, when set, is the id the cluster itself sends in clear
	// on the Telemeter paths (its bearer's cluster_id, or its /authorize id,
	// sealed in the credential) while ClusterID is its pseudonym: series
	// carrying it are rewritten to ClusterID, never stored with it. It lives
	// only in memory (the request, the verification caches) and must never
	// be logged.
	ClusterIDAlias string
	// Allow is what the credential may do. Cluster credentials may only
	// write (and read their gathering definition), never query the fleet.
	Allow Permission
}

// Permission is a set of things a credential may do.
type Permission uint8

// Permissions, as named in the tokens file's `allow` list.
const (
	PermWrite     Permission = 1 << iota // remote-write
	PermRead                             // the query API
	PermAuthorize                        // exchange for a cluster credential at /authorize
	PermPush                             // the installer's aggregation push endpoint
	PermAdmin                            // /api/v1/admin/... (erasure) of its tenant; never implied, only given by name
	// PermFleetStatus reads the status page of every tenant (the fleet's
	// operators); never implied. Admin is scoped to its own tenant, as the
	// erasure API is: a tenant's admin token must not read other tenants.
	PermFleetStatus
	// PermAll is every permission a token without an `allow` list gets:
	// PermAdmin and PermFleetStatus are not part of it.
	PermAll = PermWrite | PermRead | PermAuthorize | PermPush
	// PermCluster is what a token bound to a cluster (cluster_id) gets
	// without an `allow` list, and the most it may be given: it is that
	// cluster's credential, and reads cannot be limited to one cluster.
	PermCluster = PermWrite | PermAuthorize | PermPush
)

var permNames = map[string]Permission{"write": PermWrite, "read": PermRead, "authorize": PermAuthorize, "push": PermPush, "admin": PermAdmin, "fleet_status": PermFleetStatus}

// permOrder is permNames' keys in the order they are listed to people.
var permOrder = []string{"write", "read", "authorize", "push", "admin", "fleet_status"}

// ErrForbidden means the credential is valid but may not do this.
var ErrForbidden = errors.New("forbidden")

// Authenticator checks a request's credential. Implementations are safe for
// concurrent use and must not log secrets.
type Authenticator interface {
	Authenticate(r *http.Request) (Identity, error)
}

type identityKey struct{}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// FromContext returns the identity stored by WithIdentity.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// bearerToken extracts the token of an `Authorization: Bearer <token>` header.
func bearerToken(r *http.Request) (string, bool) {
	return ParseBearer(r.Header.Get("Authorization"))
}

// ParseBearer returns the token of an Authorization header value of the form
// "Bearer <token>" (scheme case-insensitive, any whitespace around). It is
// the one parser of bearer tokens, so every component that keys anything by
// a token sees the same token for the same header.
func ParseBearer(header string) (string, bool) {
	f := strings.Fields(header)
	if len(f) != 2 || !strings.EqualFold(f[0], "Bearer") {
		return "", false
	}
	return f[1], true
}

// Middleware authenticates every request before next sees it and requires
// the need permission. A missing or invalid credential is answered 401 with a
// WWW-Authenticate challenge, a valid one without the permission 403, and an
// upstream authorizer that cannot answer 503; all are reported to onReject
// (which may be nil).
func Middleware(a Authenticator, need Permission, onReject func(r *http.Request, err error), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := a.Authenticate(r)
		if err == nil && id.Allow&need != need {
			err = fmt.Errorf("credential of tenant %q for %s: %w", id.Tenant, r.URL.Path, errLacksPermission)
		}
		if err != nil {
			if onReject != nil {
				onReject(r, err)
			}
			switch RejectStatus(err) {
			case http.StatusForbidden:
				http.Error(w, forbiddenMessage(need, id.Allow, err), http.StatusForbidden)
			case http.StatusServiceUnavailable:
				w.Header().Set("Retry-After", "30")
				http.Error(w, "the upstream authorizer is unavailable, retry later", http.StatusServiceUnavailable)
			default:
				w.Header().Set("WWW-Authenticate", `Bearer realm="phonehome"`)
				http.Error(w, unauthorizedMessage(err), http.StatusUnauthorized)
			}
			return
		}
		next.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), id)))
	})
}

// RejectStatus is the status Middleware answers a refusal err with: 403 for
// ErrForbidden, 503 for ErrUpstream, 401 otherwise. onReject callbacks use it
// to count what the client saw.
func RejectStatus(err error) int {
	switch {
	case errors.Is(err, ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, ErrUpstream):
		return http.StatusServiceUnavailable
	default:
		return http.StatusUnauthorized
	}
}

func (p Permission) String() string {
	var names []string
	for _, n := range permOrder {
		if p&permNames[n] != 0 {
			names = append(names, n)
		}
	}
	return strings.Join(names, "+")
}

// Insecure accepts every request as Tenant. It exists only for the receiver's
// explicitly named --insecure.no-auth mode.
type Insecure struct{ Tenant string }

// Authenticate implements Authenticator.
func (i Insecure) Authenticate(*http.Request) (Identity, error) {
	return Identity{Tenant: i.Tenant, Allow: PermAll}, nil
}
