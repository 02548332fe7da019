package auth

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"testing"

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
