package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
)

func newKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return k
}

func bearer(r *http.Request, token string) *http.Request {
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}

func TestIssuerRoundTripAndRotation(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	old, cur := newKey(t), newKey(t)

	before := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"old": old}, "old"), time.Hour, clock)
	oldTok, _, err := before.Issue("acme", "c1")
	require.NoError(t, err)

	rotated := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"old": old, "new": cur}, "new"), time.Hour, clock)
	newTok, exp, err := rotated.Issue("acme", "c2")
	require.NoError(t, err)
	require.Equal(t, now.Add(time.Hour), exp)

	require.Equal(t, "new", kidOf(t, newTok), "the newest key signs")

	id, err := rotated.Verify(oldTok)
	require.NoError(t, err, "tokens of the previous key still verify during rotation")
	require.Equal(t, Identity{Tenant: "acme", ClusterID: "c1", Allow: PermWrite}, id)
	id, err = rotated.Verify(newTok)
	require.NoError(t, err)
	require.Equal(t, "c2", id.ClusterID)

	_, err = before.Verify(newTok)
	require.ErrorIs(t, err, ErrUnauthorized, "an unknown kid is refused")
}

func TestIssuerRefusesSpoofs(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	key := newKey(t)
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": key}, "k"), time.Hour, func() time.Time { return now })
	valid, _, err := iss.Issue("acme", "c1")
	require.NoError(t, err)

	sign := func(method jwt.SigningMethod, key any, kid string, c Claims) string {
		tok := jwt.NewWithClaims(method, c)
		if kid != "" {
			tok.Header["kid"] = kid
		}
		s, err := tok.SignedString(key)
		require.NoError(t, err)
		return s
	}
	claims := func(mod func(*Claims)) Claims {
		c := Claims{Tenant: "acme", RegisteredClaims: jwt.RegisteredClaims{
			Issuer: jwtIssuer, Subject: "c1", Audience: jwt.ClaimStrings{jwtAudience},
			ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)),
		}}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	parts := strings.Split(valid, ".")
	payload, _ := json.Marshal(claims(func(c *Claims) { c.Subject = "c2" }))

	for name, token := range map[string]string{
		"forged signature":      parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 64)),
		"payload swapped":       parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + parts[2],
		"alg none":              sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "k", claims(nil)),
		"alg HS256 with pubkey": sign(jwt.SigningMethodHS256, []byte(key.Public().(ed25519.PublicKey)), "k", claims(nil)),
		"other key, same kid":   sign(jwt.SigningMethodEdDSA, newKey(t), "k", claims(nil)),
		"unknown kid":           sign(jwt.SigningMethodEdDSA, key, "nope", claims(nil)),
		"no kid":                sign(jwt.SigningMethodEdDSA, key, "", claims(nil)),
		"expired":               sign(jwt.SigningMethodEdDSA, key, "k", claims(func(c *Claims) { c.ExpiresAt = jwt.NewNumericDate(now.Add(-time.Hour)) })),
		"no expiry":             sign(jwt.SigningMethodEdDSA, key, "k", claims(func(c *Claims) { c.ExpiresAt = nil })),
		"wrong audience":        sign(jwt.SigningMethodEdDSA, key, "k", claims(func(c *Claims) { c.Audience = jwt.ClaimStrings{"other"} })),
		"wrong issuer":          sign(jwt.SigningMethodEdDSA, key, "k", claims(func(c *Claims) { c.Issuer = "evil" })),
		"no subject":            sign(jwt.SigningMethodEdDSA, key, "k", claims(func(c *Claims) { c.Subject = "" })),
		"bad tenant":            sign(jwt.SigningMethodEdDSA, key, "k", claims(func(c *Claims) { c.Tenant = "../x" })),
		"garbage":               "a.b.c",
	} {
		t.Run(name, func(t *testing.T) {
			// The valid credential is in the verified cache: nothing that
			// differs from it may be served from there.
			_, err := iss.Verify(valid)
			require.NoError(t, err)
			before := iss.verified.len()
			for range 2 {
				_, err = iss.Verify(token)
				require.ErrorIs(t, err, ErrUnauthorized)
			}
			require.Equal(t, before, iss.verified.len(), "failures are not remembered")
		})
	}
}

func TestIssuerVerifiedCache(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, clock)
	tok, exp, err := iss.Issue("acme", "c1")
	require.NoError(t, err)
	want := Identity{Tenant: "acme", ClusterID: "c1", Allow: PermWrite}

	id, err := iss.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, want, id)
	require.Equal(t, 1, iss.verified.len())

	// Served from the cache: the full check would now fail (its kid
	// unknown to the same keys; another KeySet would be a reload).
	keys := iss.keys
	pub := keys.Current().byID["k"]
	forgetKey := func() { delete(keys.Current().byID, "k") }
	restoreKey := func() { keys.Current().byID["k"] = pub }
	forgetKey()
	id, err = iss.Verify(tok)
	require.NoError(t, err, "a verified credential is served from the cache")
	require.Equal(t, want, id)
	_, err = iss.Verify(tok + "x")
	require.ErrorIs(t, err, ErrUnauthorized, "one byte more is not the cached credential")
	restoreKey()

	t.Run("expiry", func(t *testing.T) {
		now = exp.Add(-time.Second)
		_, err := iss.Verify(tok)
		require.NoError(t, err, "just before exp: cached")
		now = exp
		forgetKey()
		_, err = iss.Verify(tok)
		require.ErrorIs(t, err, ErrUnauthorized, "at exp the cache no longer answers")
		restoreKey()
		require.Equal(t, 0, iss.verified.len(), "the expired entry is gone")
		now = exp.Add(10 * time.Second)
		_, err = iss.Verify(tok)
		require.NoError(t, err, "the full check keeps its 30s leeway")
		require.Equal(t, 0, iss.verified.len(), "but an expired credential is not remembered")
		now = exp.Add(31 * time.Second)
		_, err = iss.Verify(tok)
		require.ErrorIs(t, err, ErrUnauthorized, "past the leeway: refused")
	})

	t.Run("bound", func(t *testing.T) {
		now = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
		iss := NewIssuer(keys, time.Hour, clock)
		iss.verified.max = 8
		for i := range 50 {
			tok, _, err := iss.Issue("acme", fmt.Sprint("c", i))
			require.NoError(t, err)
			id, err := iss.Verify(tok)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprint("c", i), id.ClusterID)
			require.LessOrEqual(t, iss.verified.len(), 8)
		}
		require.Positive(t, iss.verified.len())
	})

	t.Run("concurrent", func(t *testing.T) {
		now = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
		iss := NewIssuer(keys, time.Hour, clock)
		iss.verified.max = 4
		toks := make([]string, 8)
		for i := range toks {
			toks[i], _, err = iss.Issue("acme", fmt.Sprint("c", i))
			require.NoError(t, err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4*100)
		for w := range 4 {
			wg.Go(func() {
				for i := range 100 {
					k := (w + i) % len(toks)
					id, err := iss.Verify(toks[k])
					if err == nil && id.ClusterID != fmt.Sprint("c", k) {
						err = fmt.Errorf("token %d verified as %q", k, id.ClusterID)
					}
					if err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func BenchmarkIssuerVerify(b *testing.B) {
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(b)}, "k"), time.Hour, nil)
	tok, _, err := iss.Issue("acme", "c1")
	require.NoError(b, err)
	for _, cached := range []bool{false, true} {
		b.Run(fmt.Sprintf("cached=%v", cached), func(b *testing.B) {
			iss.verified = expiringCache[verifiedCredential]{max: verifiedCacheSize}
			if !cached {
				iss.verified.max = 0 // remembers nothing
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := iss.Verify(tok); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestAuthorizeHandler(t *testing.T) {
	now := time.Now()
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, func() time.Time { return now })
	tokens, err := NewTokens([]TokenEntry{
		{Token: "fleet", Tenant: "acme", Allow: []string{"authorize"}},
		{Token: "bound", Tenant: "acme", ClusterID: "c9", Allow: []string{"authorize"}},
		{Token: "reader", Tenant: "acme", Allow: []string{"read"}},
	})
	require.NoError(t, err)
	h := NewAuthorizeHandler(discardLogger(), nil, tokens, iss)
	chain := Chain{Issuer: iss, Static: tokens}

	post := func(token, id string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/authorize", strings.NewReader(url.Values{"id": {id}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if token != "" {
			bearer(r, token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}

	rec := post("fleet", "c1")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var resp AuthorizeResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
	require.Equal(t, "acme", resp.Tenant)
	require.Equal(t, "c1", resp.ClusterID)
	require.Positive(t, resp.ExpiresInSeconds)

	id, err := chain.Authenticate(bearer(httptest.NewRequest(http.MethodPost, "/api/v1/write", nil), resp.Token))
	require.NoError(t, err)
	require.Equal(t, Identity{Tenant: "acme", ClusterID: "c1", Allow: PermWrite}, id)

	require.Equal(t, http.StatusUnauthorized, post("", "c1").Code)
	require.Equal(t, http.StatusUnauthorized, post("wrong", "c1").Code)
	rec = post("reader", "c1")
	require.Equal(t, http.StatusForbidden, rec.Code, "a read token may not authorize")
	require.Contains(t, rec.Body.String(), "this token lacks the authorize permission (allow: [authorize])", "a permission problem, not the cluster's")
	rec = post("bound", "c1")
	require.Equal(t, http.StatusForbidden, rec.Code, "a cluster-bound token authorizes only its cluster")
	require.Contains(t, rec.Body.String(), "may not authorize this cluster")
	require.Equal(t, http.StatusOK, post("bound", "c9").Code)
	require.Equal(t, http.StatusBadRequest, post("fleet", "").Code)
	require.Equal(t, http.StatusBadRequest, post("fleet", "has space").Code)
}

func TestFileTokensRevocation(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens.yaml")
	require.NoError(t, os.WriteFile(p, []byte("tokens:\n- {token: a, tenant: t}\n- {token: b, tenant: t}\n"), 0o600))
	ft, err := NewFileTokens(discardLogger(), nil, p)
	require.NoError(t, err)
	_, err = ft.AuthorizeFleet(t.Context(), "b", unhashed("c1"))
	require.NoError(t, err)

	require.NoError(t, os.WriteFile(p, []byte("tokens:\n- {token: a, tenant: t}\n"), 0o600))
	require.NoError(t, ft.Reload())
	_, err = ft.AuthorizeFleet(t.Context(), "b", unhashed("c1"))
	require.ErrorIs(t, err, ErrUnauthorized, "a revoked token fails at the next authorize")

	require.NoError(t, os.WriteFile(p, []byte("tokens: [{tenant: t}]\n"), 0o600))
	require.Error(t, ft.Reload())
	_, err = ft.AuthorizeFleet(t.Context(), "a", unhashed("c1"))
	require.NoError(t, err, "an invalid file keeps the previous tokens")
}

func TestLoadKeysFile(t *testing.T) {
	dir := t.TempDir()
	der, err := x509.MarshalPKCS8PrivateKey(newKey(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "k1.pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	p := filepath.Join(dir, "keys.yaml")
	require.NoError(t, os.WriteFile(p, []byte("keys:\n- kid: k1\n  created: 2026-01-01T00:00:00Z\n  private_key_file: k1.pem\n"), 0o600))
	ks, err := LoadKeysFile(p)
	require.NoError(t, err)
	require.Equal(t, "k1", ks.signer(time.Now()).kid)

	require.NoError(t, os.WriteFile(p, []byte("keys:\n- kid: k1\n  private_key_file: missing.pem\n- created: 2026-01-01T00:00:00Z\n  private_key_file: k1.pem\n"), 0o600))
	_, err = LoadKeysFile(p)
	require.ErrorContains(t, err, "keys[0].created: required")
	require.ErrorContains(t, err, "keys[0].private_key_file")
	require.ErrorContains(t, err, "keys[1].kid: required")
}

func FuzzCredential(f *testing.F) {
	key := newKey(f)
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": key}, "k"), time.Hour, nil)
	valid, _, err := iss.Issue("acme", "c1")
	require.NoError(f, err)
	tokens, err := NewTokens([]TokenEntry{{Token: "static", Tenant: "acme"}})
	require.NoError(f, err)
	chain := Chain{Issuer: iss, Static: tokens}
	for _, s := range []string{"Bearer " + valid, "Bearer static", "Bearer a.b.c", "Bearer ..", "bearer " + valid + "x", "Bearer eyJhbGciOiJub25lIn0.e30."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["Authorization"] = []string{header}
		id, err := chain.Authenticate(r)
		if err != nil {
			return
		}
		if id.Tenant != "acme" || (id.ClusterID != "" && id.ClusterID != "c1") {
			t.Fatalf("accepted %q as %+v", header, id)
		}
	})
}
