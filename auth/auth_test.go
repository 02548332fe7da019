package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTokensAuthenticate(t *testing.T) {
	sum := sha256.Sum256([]byte("hashed-secret"))
	tok, err := NewTokens([]TokenEntry{
		{Token: "plain-secret", Tenant: "acme"},
		{TokenSHA256: hex.EncodeToString(sum[:]), Tenant: "globex", ClusterID: "c1"},
	})
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		header string
		want   Identity
		ok     bool
	}{
		{"plain", "Bearer plain-secret", Identity{Tenant: "acme", Allow: PermAll}, true},
		{"hashed, bound to a cluster: no read", "Bearer hashed-secret", Identity{Tenant: "globex", ClusterID: "c1", Allow: PermWrite | PermAuthorize | PermPush}, true},
		{"scheme is case-insensitive", "bearer plain-secret", Identity{Tenant: "acme", Allow: PermAll}, true},
		{"wrong token", "Bearer nope", Identity{}, false},
		{"no header", "", Identity{}, false},
		{"basic auth", "Basic cGxhaW4tc2VjcmV0", Identity{}, false},
		{"empty bearer", "Bearer ", Identity{}, false},
		{"digest as token", "Bearer " + hex.EncodeToString(sum[:]), Identity{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			r.Header.Set("X-Scope-OrgID", "evil") // tenant headers are ignored
			id, err := tok.Authenticate(r)
			if !tc.ok {
				require.ErrorIs(t, err, ErrUnauthorized)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, id)
		})
	}
}

func TestNewTokensNamesEveryProblem(t *testing.T) {
	_, err := NewTokens([]TokenEntry{
		{Tenant: "a"},
		{Token: "x", TokenSHA256: "00", Tenant: "a"},
		{TokenSHA256: "zz", Tenant: "a"},
		{Token: "y", Tenant: "../etc"},
		{Token: "y", Tenant: "b"},
		{Token: "z", Tenant: "b", Name: "z"},
		{Token: "v", Tenant: "b", Name: "u"}, // the next entry's token
		{Token: "u", Tenant: "b"},
	})
	require.Error(t, err)
	for _, want := range []string{
		"tokens[0]: token or token_sha256 is required",
		"tokens[1]: set token or token_sha256, not both",
		"tokens[2].token_sha256: want 64 hex digits",
		`tokens[3].tenant: "../etc"`,
		"tokens[4]: same token as tokens[3]",
		"tokens[5].name: is the token itself",
		"tokens[6].name: is the token of tokens[7]",
	} {
		require.ErrorContains(t, err, want)
	}
	_, err = NewTokens(nil)
	require.ErrorContains(t, err, "at least one token")
}

// TestTokenBoundToClusterMayNotRead: a token bound to a cluster is that
// cluster's credential, and reads (the query API, the status page, the
// admin API) cannot be limited to one cluster: it may not be given them,
// and does not get them by default as an unbound token does.
func TestTokenBoundToClusterMayNotRead(t *testing.T) {
	_, err := NewTokens([]TokenEntry{
		{Token: "a", Tenant: "acme", ClusterID: "c1", Allow: []string{"write", "read"}},
		{Token: "b", Tenant: "acme", ClusterID: "c2", Allow: []string{"admin"}},
		{Token: "c", Tenant: "acme", ClusterID: "c3", Allow: []string{"fleet_status"}},
	})
	require.Error(t, err)
	for _, want := range []string{
		`tokens[0].allow: a token bound to a cluster (cluster_id) may only write, authorize and push, not read`,
		`tokens[1].allow: a token bound to a cluster (cluster_id) may only write, authorize and push, not admin`,
		`tokens[2].allow: a token bound to a cluster (cluster_id) may only write, authorize and push, not fleet_status`,
	} {
		require.ErrorContains(t, err, want)
	}

	tok, err := NewTokens([]TokenEntry{
		{Token: "bound", Tenant: "acme", ClusterID: "c1"},
		{Token: "pusher", Tenant: "acme", ClusterID: "c1", Allow: []string{"push"}},
	})
	require.NoError(t, err)
	id, err := tok.lookup("bound")
	require.NoError(t, err)
	require.Equal(t, PermWrite|PermAuthorize|PermPush, id.Allow, "write, authorize and push, as an unbound token gets them, without read")
	id, err = tok.lookup("pusher")
	require.NoError(t, err)
	require.Equal(t, PermPush, id.Allow)
}

func TestLoadTokensFileStrict(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "tokens.yaml")
	require.NoError(t, os.WriteFile(p, []byte("tokens:\n- token: a\n  tenant: t\n  tennant: x\n"), 0o600))
	_, err := LoadTokensFile(p)
	require.ErrorContains(t, err, "tokens[0].tennant: line 4: unknown key")

	require.NoError(t, os.WriteFile(p, []byte("tokens:\n- token: a\n  tenant: t\n"), 0o600))
	tok, err := LoadTokensFile(p)
	require.NoError(t, err)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer a")
	id, err := tok.Authenticate(r)
	require.NoError(t, err)
	require.Equal(t, "t", id.Tenant)
}

// A token written in the wrong place or shape of the tokens or keys file is
// named by its path, line and kind, never quoted: --check-config and the
// logs print these errors.
func TestSecretFilesErrorsNeverQuoteAToken(t *testing.T) {
	const long, short = "tok3n-s3cr3t-0123456789", "hunter2" // yaml.v3 quoted the first 7 bytes of a long value, all of a short one
	dir := t.TempDir()
	for _, tc := range []struct {
		name, file, doc, want string
		load                  func(string) error
	}{
		{"a token for an entry", "tokens.yaml", "tokens:\n- " + long + "\n", "tokens[0]: line 2: want a mapping, found a string", loadTokens},
		{"a token for the list", "tokens.yaml", "tokens: " + long + "\n", "tokens: line 1: want a sequence, found a string", loadTokens},
		{"a token under allow", "tokens.yaml", "tokens:\n- tenant: acme\n  allow: " + long + "\n", "tokens[0].allow: line 3: want a sequence, found a string", loadTokens},
		{"a short token under allow", "tokens.yaml", "tokens:\n- tenant: acme\n  allow: " + short + "\n", "tokens[0].allow: line 3: want a sequence, found a string", loadTokens},
		{"a token under created", "keys.yaml", "keys:\n- kid: k1\n  created: " + long + "\n", "keys[0].created: line 3: want an RFC 3339 timestamp such as 2026-11-01T00:00:00Z, found a string", loadKeys},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.file)
			require.NoError(t, os.WriteFile(p, []byte(tc.doc), 0o600))
			err := tc.load(p)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), long[:7])
			require.NotContains(t, err.Error(), short)
		})
	}
}

func loadTokens(p string) error { _, err := LoadTokensFile(p); return err }
func loadKeys(p string) error   { _, err := LoadKeysFile(p); return err }

func TestMiddleware(t *testing.T) {
	tok, err := NewTokens([]TokenEntry{{Token: "s", Tenant: "acme"}})
	require.NoError(t, err)
	var rejected int
	h := Middleware(tok, PermRead, func(*http.Request, error) { rejected++ }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := FromContext(r.Context())
		require.True(t, ok)
		_, _ = w.Write([]byte(id.Tenant))
	}))

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.NotEmpty(t, rec.Header().Get("WWW-Authenticate"))
	require.Equal(t, 1, rejected)

	rec = httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer s")
	h.ServeHTTP(rec, r)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "acme", rec.Body.String())
}

func FuzzAuthorizationHeader(f *testing.F) {
	tok, err := NewTokens([]TokenEntry{{Token: "s3cret", Tenant: "acme"}})
	require.NoError(f, err)
	for _, s := range []string{"Bearer s3cret", "bearer  s3cret ", "Bearer", "Basic x", "", "Bearer \x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["Authorization"] = []string{header}
		id, err := tok.Authenticate(r)
		if err == nil && id.Tenant != "acme" {
			t.Fatalf("accepted %q as %+v", header, id)
		}
	})
}

// TestChainWithoutStaticTokens: a static token sent to a Chain that has
// none is refused as unauthorized, like any unknown token.
func TestChainWithoutStaticTokens(t *testing.T) {
	_, err := Chain{}.Authenticate(bearerReq("static"))
	require.ErrorIs(t, err, ErrUnauthorized)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// A token bound to the raw id acts as the pseudonym, with the raw id as its
// alias; one bound to the pseudonym, or to none, is unchanged.
func TestPseudonymTokens(t *testing.T) {
	h, err := NewClusterIDHasher([]byte("0123456789abcdef"))
	require.NoError(t, err)
	const raw = "0f2c6b3e-6d0e-4e7b-9a51-2d6f1c9b8a77"
	ps := h.Pseudonym(raw)
	toks, err := NewTokens([]TokenEntry{
		{Token: "raw", Tenant: "acme", ClusterID: raw},
		{Token: "ps", Tenant: "acme", ClusterID: ps},
		{Token: "unbound", Tenant: "acme"},
	})
	require.NoError(t, err)
	a := PseudonymTokens{Authenticator: toks, Hasher: h}
	for token, want := range map[string]Identity{
		"raw":     {Tenant: "acme", ClusterID: ps, ClusterIDAlias: raw, Allow: PermCluster},
		"ps":      {Tenant: "acme", ClusterID: ps, Allow: PermCluster},
		"unbound": {Tenant: "acme", Allow: PermAll},
	} {
		r := httptest.NewRequest(http.MethodPost, "/api/v1/write", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		id, err := a.Authenticate(r)
		require.NoError(t, err, token)
		require.Equal(t, want, id, token)
	}
}
