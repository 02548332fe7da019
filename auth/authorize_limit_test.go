package auth

import (
	"crypto/ed25519"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A form over the limit is 413 naming the limit, not a bad id.
func TestAuthorizeOversizedBodyIs413(t *testing.T) {
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, nil)
	tokens, err := NewTokens([]TokenEntry{{Token: "fleet", Tenant: "acme", Allow: []string{"authorize"}}})
	require.NoError(t, err)
	h := NewAuthorizeHandler(discardLogger(), nil, tokens, iss)
	r := httptest.NewRequest(http.MethodPost, "/authorize", strings.NewReader("id=c1&pad="+strings.Repeat("a", 4<<10)))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, bearer(r, "fleet"))
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "request body exceeds the limit of 4096 bytes")
}
