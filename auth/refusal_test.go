package auth

import (
	"crypto/ed25519"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMiddlewareRefusalsSayWhatIsMissing: a 403 names the permission in
// the tokens file's words, and tells a fleet token refused a write that it
// is exchanged at /authorize (which needs auth.keys_file); a 401 on
// Telemeter's path says what its bearer must be.
func TestMiddlewareRefusalsSayWhatIsMissing(t *testing.T) {
	tok, err := NewTokens([]TokenEntry{
		{Token: "fleet", Tenant: "acme", Allow: []string{"authorize"}},
		{Token: "reader", Tenant: "acme", Allow: []string{"read"}},
	})
	require.NoError(t, err)
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	serve := func(a Authenticator, need Permission, bearer string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Authorization", "Bearer "+bearer)
		rec := httptest.NewRecorder()
		Middleware(a, need, nil, ok).ServeHTTP(rec, r)
		return rec
	}
	for _, tc := range []struct {
		name, bearer string
		need         Permission
		want         []string
		not          []string
	}{
		{"fleet token at a write path", "fleet", PermWrite,
			[]string{"may not write series (allow: [write])", "exchange it at POST /authorize", "auth.keys_file"}, nil},
		{"read token at a write path", "reader", PermWrite,
			[]string{"may not write series (allow: [write])"}, []string{"/authorize"}},
		{"read token at the admin API", "reader", PermAdmin,
			[]string{"may not use the admin API (allow: [admin])"}, nil},
		{"fleet token at the push path", "fleet", PermPush,
			[]string{"may not push (allow: [push])"}, []string{"/authorize"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := serve(tok, tc.need, tc.bearer)
			require.Equal(t, http.StatusForbidden, rec.Code)
			for _, w := range tc.want {
				require.Contains(t, rec.Body.String(), w)
			}
			for _, n := range tc.not {
				require.NotContains(t, rec.Body.String(), n)
			}
		})
	}

	telemeter := NewTelemeterBearer(nil, tok, TelemeterOptions{})
	rec := serve(telemeter, PermWrite, "fleet") // the fleet token itself, not wrapped
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Contains(t, rec.Body.String(), `base64 of JSON {"authorization_token": <fleet token>, "cluster_id": <cluster id>}`)
	require.Contains(t, rec.Body.String(), "telemeter bearer is not base64")
	rec = serve(telemeter, PermWrite, base64.StdEncoding.EncodeToString([]byte(`{"authorization_token":"fleet"}`)))
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Contains(t, rec.Body.String(), "telemeter bearer has no cluster_id")
	rec = serve(telemeter, PermWrite, base64.StdEncoding.EncodeToString([]byte(`{"authorization_token":"reader","cluster_id":"c1"}`)))
	require.Equal(t, http.StatusForbidden, rec.Code)
	require.Contains(t, rec.Body.String(), "lacks the authorize permission (allow: [authorize])")
	require.NotContains(t, rec.Body.String(), "allow: [write]", "a write permission would not let it through")
	rec = serve(tok, PermWrite, "unknown")
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.NotContains(t, rec.Body.String(), "authorization_token", "the hint is for Telemeter's bearer only")
}

// The 401s of a cluster's write paths say what was refused and what to do,
// never quoting a token or a cluster id: an expired credential (authorize
// again), a fleet token the authorizer refused, and a pseudonym-shaped
// cluster_id under pseudonyms: refuse (as /authorize says it, still 401).
func TestClusterRefusalsSayWhatWasRefused(t *testing.T) {
	const raw = "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f"
	clock := newClock()
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, clock.Now)
	credential, _, err := iss.Issue("acme", "c1")
	require.NoError(t, err)
	hasher, err := NewClusterIDHasher([]byte("0123456789abcdef-fleet-key"))
	require.NoError(t, err)
	hasher.RefusePseudonyms = true
	tok, err := NewTokens([]TokenEntry{
		{Token: "fleet", Tenant: "acme", Allow: []string{"authorize"}},
		{Token: "other-cluster", Tenant: "acme", ClusterID: "another-cluster", Allow: []string{"authorize"}},
	})
	require.NoError(t, err)
	telemeter := NewTelemeterBearer(nil, tok, TelemeterOptions{Hasher: hasher})

	for _, tc := range []struct {
		name   string
		a      Authenticator
		bearer string
		before func()
		code   int
		want   string
	}{
		{"expired cluster credential", Chain{Issuer: iss}, credential, func() { clock.Advance(2 * time.Hour) },
			http.StatusUnauthorized, "the cluster credential has expired: authorize again at POST /authorize"},
		{"unknown fleet token", telemeter, telemeterBearer("unknown-secret", raw), nil,
			http.StatusUnauthorized, "the fleet authorizer refused the bearer's authorization_token (an unknown or revoked token)"},
		{"fleet token refused for this cluster", telemeter, telemeterBearer("other-cluster", raw), nil,
			http.StatusForbidden, "the fleet authorizer refused this cluster_id for the bearer's authorization_token"},
		{"pseudonym under pseudonyms: refuse", telemeter, telemeterBearer("fleet", hasher.Pseudonym(raw)), nil,
			http.StatusUnauthorized, "the bearer's cluster_id: the cluster id has the shape of a stored pseudonym (22 base64url characters), and this receiver takes only raw cluster ids (auth.cluster_id_hash.pseudonyms: refuse)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set("Authorization", "Bearer "+tc.bearer)
			rec := httptest.NewRecorder()
			Middleware(tc.a, PermWrite, nil, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				t.Error("served")
			})).ServeHTTP(rec, r)
			require.Equal(t, tc.code, rec.Code)
			require.Contains(t, rec.Body.String(), tc.want)
			for _, secret := range []string{tc.bearer, "unknown-secret", "other-cluster", raw, hasher.Pseudonym(raw)} {
				require.NotContains(t, rec.Body.String(), secret)
			}
		})
	}
}
