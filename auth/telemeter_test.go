package auth

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// telemeterBearer is the bearer cluster-monitoring-operator renders for
// Prometheus' telemetry remote-write.
func telemeterBearer(token, clusterID string) string {
	b, _ := json.Marshal(map[string]string{"authorization_token": token, "cluster_id": clusterID})
	return base64.StdEncoding.EncodeToString(b)
}

func TestParseTelemeterBearer(t *testing.T) {
	valid := telemeterBearer("pull-secret", "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f")
	for _, tc := range []struct {
		name, bearer string
		ok           bool
	}{
		{"cluster-monitoring-operator's", valid, true},
		{"unpadded", strings.TrimRight(valid, "="), true},
		{"url-safe", base64.URLEncoding.EncodeToString([]byte(`{"authorization_token":"a?>b","cluster_id":"c1"}`)), true},
		{"garbage base64", "!!not base64!!", false},
		{"base64 of garbage", base64.StdEncoding.EncodeToString([]byte("not json")), false},
		{"no cluster_id", base64.StdEncoding.EncodeToString([]byte(`{"authorization_token":"t"}`)), false},
		{"no token", base64.StdEncoding.EncodeToString([]byte(`{"cluster_id":"c1"}`)), false},
		{"cluster_id of a bad shape", telemeterBearer("t", "has space"), false},
		{"cluster_id of the wrong type", base64.StdEncoding.EncodeToString([]byte(`{"authorization_token":"t","cluster_id":7}`)), false},
		{"too long", strings.Repeat("A", maxTelemeterBearer+4), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			token, id, err := ParseTelemeterBearer(tc.bearer)
			if !tc.ok {
				require.ErrorIs(t, err, ErrUnauthorized)
				require.NotContains(t, err.Error(), "pull-secret", "errors never quote the token")
				return
			}
			require.NoError(t, err)
			require.NotEmpty(t, token)
			require.NotEmpty(t, id)
		})
	}
}

func TestTelemeterBearerBindsAndCaches(t *testing.T) {
	tokens, err := NewTokens([]TokenEntry{
		{Token: "fleet", Tenant: "acme", Allow: []string{"authorize"}},
		{Token: "reader", Tenant: "acme", Allow: []string{"read"}},
	})
	require.NoError(t, err)
	fleet := &swappableFleet{FleetAuthorizer: tokens}
	now := time.Now()
	a := NewTelemeterBearer(nil, fleet, TelemeterOptions{CacheTTL: time.Minute, now: func() time.Time { return now }})
	auth := func(bearer string) (Identity, error) {
		return a.Authenticate(bearerReq(bearer))
	}

	id, err := auth(telemeterBearer("fleet", "c1"))
	require.NoError(t, err)
	require.Equal(t, Identity{Tenant: "acme", ClusterID: "c1", Allow: PermWrite}, id, "bound to its cluster, write only")
	_, err = auth(telemeterBearer("reader", "c1"))
	require.ErrorIs(t, err, ErrForbidden, "checked like a fleet token at /authorize")
	_, err = auth(telemeterBearer("unknown", "c1"))
	require.ErrorIs(t, err, ErrUnauthorized)
	_, err = auth("garbage")
	require.ErrorIs(t, err, ErrUnauthorized)

	// Revoke the token: the cached answer holds for the TTL, then not.
	revoked, err := NewTokens([]TokenEntry{{Token: "other", Tenant: "acme"}})
	require.NoError(t, err)
	fleet.FleetAuthorizer = revoked
	_, err = auth(telemeterBearer("fleet", "c1"))
	require.NoError(t, err, "cached")
	require.InDelta(t, 1, testutil.ToFloat64(a.checks.WithLabelValues("cached")), 0)
	_, err = auth(telemeterBearer("fleet", "c2"))
	require.ErrorIs(t, err, ErrUnauthorized, "the cache is keyed by token and cluster")
	now = now.Add(time.Minute)
	_, err = auth(telemeterBearer("fleet", "c1"))
	require.ErrorIs(t, err, ErrUnauthorized, "revoked once the TTL has passed")
}

func TestTelemeterBearerCacheIsBounded(t *testing.T) {
	tokens, err := NewTokens([]TokenEntry{{Token: "fleet", Tenant: "acme", Allow: []string{"authorize"}}})
	require.NoError(t, err)
	a := NewTelemeterBearer(nil, tokens, TelemeterOptions{CacheSize: 100})
	for i := range 1000 {
		_, err := a.Authenticate(bearerReq(telemeterBearer("fleet", "c"+strings.Repeat("x", i%50)+string(rune('a'+i%26))+string(rune('a'+i/26%26)))))
		require.NoError(t, err)
		require.LessOrEqual(t, a.allowed.len(), 100)
	}
}

func TestTelemeterBearerHashesTheClusterID(t *testing.T) {
	tokens, err := NewTokens([]TokenEntry{{Token: "fleet", Tenant: "acme", Allow: []string{"authorize"}}})
	require.NoError(t, err)
	h, err := NewClusterIDHasher([]byte("0123456789abcdef-fleet-key"))
	require.NoError(t, err)
	a := NewTelemeterBearer(nil, tokens, TelemeterOptions{Hasher: h})
	raw := "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f"
	id, err := a.Authenticate(bearerReq(telemeterBearer("fleet", raw)))
	require.NoError(t, err)
	require.Len(t, id.ClusterID, 22)
	require.NotEqual(t, raw, id.ClusterID)
	require.Equal(t, raw, id.ClusterIDAlias, "series carrying the raw id are rewritten")
	require.Equal(t, h.Pseudonym(raw), id.ClusterID, "stable")

	// A forwarder's pseudonym is not hashed again.
	id, err = a.Authenticate(bearerReq(telemeterBearer("fleet", id.ClusterID)))
	require.NoError(t, err)
	require.Equal(t, h.Pseudonym(raw), id.ClusterID)
	require.Empty(t, id.ClusterIDAlias)

	_, err = NewClusterIDHasher([]byte("short"))
	require.Error(t, err)
}

func TestAuthorizeHandlerSpeaksTelemeter(t *testing.T) {
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, nil)
	tokens, err := NewTokens([]TokenEntry{{Token: "fleet", Tenant: "acme", Allow: []string{"authorize"}}})
	require.NoError(t, err)
	h, err := NewClusterIDHasher([]byte("0123456789abcdef-fleet-key"))
	require.NoError(t, err)
	iss.Hasher = h
	ah := NewAuthorizeHandler(discardLogger(), nil, tokens, iss)

	// telemeter-client: the id in the query, no body.
	raw := "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f"
	r := bearer(httptest.NewRequest(http.MethodPost, "/authorize?id="+raw, nil), "fleet")
	rec := httptest.NewRecorder()
	ah.ServeHTTP(rec, r)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var resp struct {
		Version          int               `json:"version"`
		Token            string            `json:"token"`
		ExpiresInSeconds int64             `json:"expiresInSeconds"`
		Labels           map[string]string `json:"labels"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
	require.Equal(t, 1, resp.Version)
	require.InDelta(t, 3600, resp.ExpiresInSeconds, 2)
	require.Equal(t, map[string]string{"_id": h.Pseudonym(raw)}, resp.Labels, "the pseudonym, never the raw id")
	require.NotContains(t, rec.Body.String(), raw)

	id, err := iss.Verify(resp.Token)
	require.NoError(t, err)
	require.Equal(t, h.Pseudonym(raw), id.ClusterID)
}

// swappableFleet lets a test revoke tokens.
type swappableFleet struct{ FleetAuthorizer }

func bearerReq(token string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/metrics/v1/receive", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}

func FuzzParseTelemeterBearer(f *testing.F) {
	f.Add(telemeterBearer("pull-secret", "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f"))
	f.Add(base64.StdEncoding.EncodeToString([]byte(`{"authorization_token":"t"}`)))
	f.Add("e30=")
	f.Add("")
	f.Fuzz(func(t *testing.T, bearer string) {
		token, id, err := ParseTelemeterBearer(bearer)
		if err != nil {
			require.ErrorIs(t, err, ErrUnauthorized)
			return
		}
		require.NotEmpty(t, token)
		require.True(t, clusterIDRE.MatchString(id), "an accepted cluster id has the allowed shape: %q", id)
	})
}

// An authorizer that cannot answer (the webhook is down) is 503 with
// Retry-After on the Telemeter path, never a 401 that would look like a
// revoked token.
func TestTelemeterBearerUpstreamDownIs503(t *testing.T) {
	a := NewTelemeterBearer(nil, downFleet{}, TelemeterOptions{})
	h := Middleware(a, PermWrite, nil, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Fatal("reached the handler") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, bearerReq(telemeterBearer("fleet", "c1")))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "30", rec.Header().Get("Retry-After"))
	require.Equal(t, 1.0, testutil.ToFloat64(a.checks.WithLabelValues("upstream_error")))
}

type downFleet struct{}

func (downFleet) AuthorizeFleet(context.Context, string, ClusterIDs) (string, error) {
	return "", fmt.Errorf("webhook: %w", ErrUpstream)
}

// TestTokenBoundByRawIDOrPseudonym: with cluster_id_hash, a fleet token bound in the
// tokens file to a cluster authorizes that cluster whether the file names
// its raw id or its pseudonym, and no other cluster.
func TestTokenBoundByRawIDOrPseudonym(t *testing.T) {
	h, err := NewClusterIDHasher([]byte("0123456789abcdef-fleet-key"))
	require.NoError(t, err)
	const raw = "5f6c2a9e-3b1d-4c7e-9a0f-2d8e4b6c1a73"
	tok, err := NewTokens([]TokenEntry{
		{Token: "by-raw", Tenant: "acme", ClusterID: raw, Allow: []string{"authorize"}},
		{Token: "by-pseudonym", Tenant: "acme", ClusterID: h.Pseudonym(raw), Allow: []string{"authorize"}},
	})
	require.NoError(t, err)
	for _, token := range []string{"by-raw", "by-pseudonym"} {
		for _, sent := range []string{raw, h.Pseudonym(raw)} {
			if token == "by-raw" && sent != raw {
				continue // a forwarder sends the pseudonym: bind it by the pseudonym
			}
			tenant, err := tok.AuthorizeFleet(context.Background(), token, ClusterIDs{Sent: sent, Stored: h.Pseudonym(sent)})
			require.NoError(t, err, "%s sent %s", token, sent)
			require.Equal(t, "acme", tenant)
		}
		_, err := tok.AuthorizeFleet(context.Background(), token, ClusterIDs{Sent: "another-cluster", Stored: h.Pseudonym("another-cluster")})
		require.ErrorIs(t, err, ErrForbidden, token)
	}
}
