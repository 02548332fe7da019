package auth

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const sealRawID = "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f"

func newSealTestHasher(t *testing.T, key string) *ClusterIDHasher {
	t.Helper()
	h, err := NewClusterIDHasher([]byte(key))
	require.NoError(t, err)
	return h
}

// The sealed raw id opens only with the key it was sealed with, for the
// pseudonym it was sealed for, and untouched; it never shows the raw id.
func TestIDSealerOpensOnlyWhatItSealed(t *testing.T) {
	h := newSealTestHasher(t, "0123456789abcdef-fleet-key")
	stored := h.Pseudonym(sealRawID)
	sealed := h.sealer.seal(sealRawID, stored)
	require.NotContains(t, sealed, sealRawID)
	require.NotEqual(t, sealed, h.sealer.seal(sealRawID, stored), "a random nonce per seal")

	raw, err := h.sealer.open(sealed, stored)
	require.NoError(t, err)
	require.Equal(t, sealRawID, raw)

	b, err := base64.RawURLEncoding.DecodeString(sealed)
	require.NoError(t, err)
	for i := range b {
		tampered := append([]byte(nil), b...)
		tampered[i] ^= 1
		_, err := h.sealer.open(base64.RawURLEncoding.EncodeToString(tampered), stored)
		require.Error(t, err, "byte %d flipped", i)
	}
	_, err = h.sealer.open(sealed[:len(sealed)-4], stored)
	require.Error(t, err, "truncated")
	_, err = h.sealer.open("not base64!", stored)
	require.Error(t, err)
	_, err = h.sealer.open(sealed, h.Pseudonym("another-cluster-id"))
	require.Error(t, err, "sealed for another pseudonym")

	other := newSealTestHasher(t, "another-fleet-key-0123456789")
	_, err = other.sealer.open(sealed, stored)
	require.Error(t, err, "another cluster_id_hash key")
}

// authorizeRaw asks iss (through /authorize) for the credential of a
// cluster that sends its raw id, as telemeter-client does.
func authorizeRaw(t *testing.T, iss *Issuer, id string) AuthorizeResponse {
	t.Helper()
	fleet := fleetFunc(func(context.Context, string, ClusterIDs) (string, error) { return "acme", nil })
	rec := httptest.NewRecorder()
	NewAuthorizeHandler(discardLogger(), nil, fleet, iss).ServeHTTP(rec,
		bearer(httptest.NewRequest(http.MethodPost, "/authorize?id="+id, nil), "fleet"))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var resp AuthorizeResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
	return resp
}

// payloadOf returns a credential's claims as JSON, unverified.
func payloadOf(t *testing.T, tok string) []byte {
	t.Helper()
	parts := strings.Split(tok, ".")
	require.Len(t, parts, 3)
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	return b
}

// claimsOf decodes a credential's claims, unverified.
func claimsOf(t *testing.T, tok string) map[string]any {
	t.Helper()
	var c map[string]any
	require.NoError(t, json.Unmarshal(payloadOf(t, tok), &c))
	return c
}

// A credential issued for a raw id carries it sealed, and verifies to an
// identity whose alias is that raw id, as the Telemeter bearer's does: its
// writes rewrite the raw id on every path. The open is paid once per
// credential: the verification cache keeps the alias.
func TestCredentialOfARawIDCarriesItsAlias(t *testing.T) {
	h := newSealTestHasher(t, "0123456789abcdef-fleet-key")
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, nil)
	iss.Hasher = h

	resp := authorizeRaw(t, iss, sealRawID)
	require.NotContains(t, resp.Token, sealRawID)
	require.NotContains(t, string(payloadOf(t, resp.Token)), sealRawID, "the claims do not show the raw id")
	require.Contains(t, claimsOf(t, resp.Token), "sealed_id")

	want := Identity{Tenant: "acme", ClusterID: h.Pseudonym(sealRawID), ClusterIDAlias: sealRawID, Allow: PermWrite}
	id, err := iss.Verify(resp.Token)
	require.NoError(t, err)
	require.Equal(t, want, id)

	iss.Hasher = nil // the cached verification does not open the claim again
	id, err = iss.Verify(resp.Token)
	require.NoError(t, err)
	require.Equal(t, want, id)
}

// A cluster that sends a pseudonym (a forwarder), and any cluster without
// cluster_id_hash, gets a credential without the claim: there is no raw id
// to rewrite.
func TestCredentialWithoutARawIDHasNoClaim(t *testing.T) {
	h := newSealTestHasher(t, "0123456789abcdef-fleet-key")
	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, nil)
	iss.Hasher = h
	forwarder := h.Pseudonym("hashed-in-cluster")
	resp := authorizeRaw(t, iss, forwarder)
	require.NotContains(t, claimsOf(t, resp.Token), "sealed_id")
	id, err := iss.Verify(resp.Token)
	require.NoError(t, err)
	require.Equal(t, Identity{Tenant: "acme", ClusterID: forwarder, Allow: PermWrite}, id)

	unhashedIss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, nil)
	resp = authorizeRaw(t, unhashedIss, sealRawID)
	require.NotContains(t, claimsOf(t, resp.Token), "sealed_id")
	id, err = unhashedIss.Verify(resp.Token)
	require.NoError(t, err)
	require.Equal(t, Identity{Tenant: "acme", ClusterID: sealRawID, Allow: PermWrite}, id)
}

// A credential issued before the claim existed (or by a release without
// it) keeps working until it expires, without an alias.
func TestCredentialIssuedBeforeTheClaimStillVerifies(t *testing.T) {
	key := newKey(t)
	h := newSealTestHasher(t, "0123456789abcdef-fleet-key")
	old := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": key}, "k"), time.Hour, nil)
	tok, _, err := old.Issue("acme", h.Pseudonym(sealRawID)) // what /authorize issued before
	require.NoError(t, err)

	iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": key}, "k"), time.Hour, nil)
	iss.Hasher = h
	id, err := iss.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, Identity{Tenant: "acme", ClusterID: h.Pseudonym(sealRawID), Allow: PermWrite}, id)
}

// A credential whose sealed id does not open (issued under another
// cluster_id_hash key, or where this receiver has none) is refused with a
// 401 that tells the cluster to authorize again, never accepted without
// its alias: its writes would store the raw id.
func TestCredentialWhoseSealedIDDoesNotOpenIsRefused(t *testing.T) {
	key := newKey(t)
	before := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": key}, "k"), time.Hour, nil)
	before.Hasher = newSealTestHasher(t, "0123456789abcdef-fleet-key")
	tok := authorizeRaw(t, before, sealRawID).Token

	for name, hasher := range map[string]*ClusterIDHasher{
		"another key": newSealTestHasher(t, "another-fleet-key-0123456789"),
		"no key":      nil,
	} {
		t.Run(name, func(t *testing.T) {
			iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": key}, "k"), time.Hour, nil)
			iss.Hasher = hasher
			_, err := iss.Verify(tok)
			require.ErrorIs(t, err, ErrUnauthorized)
			require.NotContains(t, err.Error(), sealRawID)

			rec := httptest.NewRecorder()
			Middleware(Chain{Issuer: iss}, PermWrite, nil, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				t.Error("served")
			})).ServeHTTP(rec, bearer(httptest.NewRequest(http.MethodPost, "/upload", nil), tok))
			require.Equal(t, http.StatusUnauthorized, rec.Code)
			require.Contains(t, rec.Body.String(), "another auth.cluster_id_hash key: authorize again at POST /authorize")
		})
	}
}
