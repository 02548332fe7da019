// Package auth authenticates receiver requests and carries the caller's
// identity (tenant and, optionally, a bound cluster id) in the request context.
// Identity is never taken from client-supplied tenant headers.
package auth

import (
	"context"
	"errors"
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
}

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
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// Middleware authenticates every request before next sees it. A failure is
// answered 401 with a WWW-Authenticate challenge, and reported to onReject.
func Middleware(a Authenticator, onReject func(r *http.Request, err error), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := a.Authenticate(r)
		if err != nil {
			if onReject != nil {
				onReject(r, err)
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="phonehome"`)
			http.Error(w, "unauthorized: a valid bearer token is required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), id)))
	})
}

// Insecure accepts every request as Tenant. It exists only for the receiver's
// explicitly named --insecure.no-auth mode.
type Insecure struct{ Tenant string }

// Authenticate implements Authenticator.
func (i Insecure) Authenticate(*http.Request) (Identity, error) {
	return Identity{Tenant: i.Tenant}, nil
}
