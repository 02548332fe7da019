package auth

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Credential claims. alg is pinned to EdDSA: tokens with any other alg,
// "none" included, are refused before any key is looked at.
const (
	jwtAlg      = "EdDSA"
	jwtIssuer   = "phonehome"
	jwtAudience = "phonehome-receiver"
)

// Claims are the claims of a cluster credential: the tenant and the
// cluster's pseudonymous id (`sub`) it may write as.
type Claims struct {
	Tenant string `json:"tenant"`
	// SealedID is the raw id of a cluster that sent it in clear at
	// /authorize, sealed with a key derived from the cluster_id_hash secret
	// (idSealer): writes with the credential rewrite it to `sub` wherever a
	// series carries it. Empty when the cluster sent its pseudonym, without
	// cluster_id_hash, and in credentials issued before it existed.
	SealedID string `json:"sealed_id,omitempty"`
	jwt.RegisteredClaims
}

// Issuer signs and verifies short-lived cluster credentials.
type Issuer struct {
	// Hasher, with auth.cluster_id_hash, seals the raw id of a cluster
	// that sent it in clear into its credential (IssueCluster), opens it
	// again in Verify, and turns ids sent in clear at /authorize into
	// pseudonyms (AuthorizeHandler). Set it before the Issuer is used.
	Hasher *ClusterIDHasher

	keys     KeySource
	ttl      time.Duration
	now      func() time.Time
	verified expiringCache[verifiedCredential] // by SHA-256 of credentials that verified, until they expire
}

// verifiedCredential is what Verify remembers of a credential: the identity
// it binds, and the keys it verified with (a reload may remove its key).
type verifiedCredential struct {
	id   Identity
	keys *KeySet
}

// verifiedCacheSize bounds the credentials an Issuer remembers as verified:
// a few MB, and more than the clusters one receiver replica serves at once.
const verifiedCacheSize = 16384

// NewIssuer returns an Issuer signing with the keys keys has in force at
// each call: the newest whose created has passed (KeysFile). now may be
// nil (time.Now).
func NewIssuer(keys KeySource, ttl time.Duration, now func() time.Time) *Issuer {
	if now == nil {
		now = time.Now
	}
	return &Issuer{keys: keys, ttl: ttl, now: now, verified: expiringCache[verifiedCredential]{max: verifiedCacheSize}}
}

// Issue signs a credential binding tenant and clusterID, valid for the TTL.
func (i *Issuer) Issue(tenant, clusterID string) (string, time.Time, error) {
	return i.IssueCluster(tenant, ClusterIDs{Sent: clusterID, Stored: clusterID})
}

// IssueCluster signs a credential binding tenant and cluster.Stored, valid
// for the TTL. A cluster that sent another id (its raw id, which Hasher
// turned into Stored) gets it sealed in the credential, so that every
// write with the credential rewrites it (Identity.ClusterIDAlias).
func (i *Issuer) IssueCluster(tenant string, cluster ClusterIDs) (string, time.Time, error) {
	var sealed string
	if cluster.Sent != cluster.Stored {
		if i.Hasher == nil {
			return "", time.Time{}, errors.New("issue credential: a cluster id sent in clear, and no auth.cluster_id_hash key to seal it")
		}
		sealed = i.Hasher.sealer.seal(cluster.Sent, cluster.Stored)
	}
	now := i.now()
	exp := now.Add(i.ttl)
	k := i.keys.Current().signer(now)
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, Claims{
		Tenant:   tenant,
		SealedID: sealed,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    jwtIssuer,
			Subject:   cluster.Stored,
			Audience:  jwt.ClaimStrings{jwtAudience},
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now.Add(-time.Minute)),
			ExpiresAt: jwt.NewNumericDate(exp),
		},
	})
	tok.Header["kid"] = k.kid
	s, err := tok.SignedString(k.private)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("sign credential: %w", err)
	}
	return s, exp, nil
}

// Verify checks a credential and returns the identity it binds.
//
// A credential that verified is remembered (by its SHA-256, with the
// identity it binds) until its expiry, so a cluster that writes often pays
// for one signature check (and one open of its sealed id) per credential
// rather than one per request, and a cluster hammering the receiver is
// refused by the limits for next to nothing. Only successes are
// remembered: a token that differs from a verified one in any byte,
// signature included, is checked in full. An entry serves only while the
// keys it verified with are in force: after a reload that changed the keys
// file each credential is checked in full once more, so one signed by a
// removed key is refused. An expired entry is not served (the full check
// then applies its 30s leeway as before). One credential cannot be revoked
// before it expires, with or without the cache (only all those of a
// removed key): revoking a fleet token takes effect at the cluster's next
// /authorize.
func (i *Issuer) Verify(token string) (Identity, error) {
	now := i.now()
	keys := i.keys.Current()
	sum := sha256.Sum256([]byte(token))
	if v, _, ok := i.verified.get(sum, now); ok && v.keys == keys {
		return v.id, nil
	}
	id, exp, err := i.verify(token, keys)
	if err != nil {
		return Identity{}, err
	}
	i.verified.put(sum, verifiedCredential{id: id, keys: keys}, exp, now)
	return id, nil
}

// verify is Verify without the cache, with keys; it also returns the
// credential's expiry.
func (i *Issuer) verify(token string, keys *KeySet) (Identity, time.Time, error) {
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		pub, ok := keys.byID[kid]
		if !ok {
			return nil, fmt.Errorf("unknown kid %q", kid)
		}
		return pub, nil
	},
		jwt.WithValidMethods([]string{jwtAlg}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuer(jwtIssuer),
		jwt.WithAudience(jwtAudience),
		jwt.WithTimeFunc(i.now),
		jwt.WithLeeway(30*time.Second),
		jwt.WithStrictDecoding(),
	)
	if errors.Is(err, jwt.ErrTokenExpired) {
		return Identity{}, time.Time{}, errCredentialExpired
	}
	if err != nil {
		return Identity{}, time.Time{}, fmt.Errorf("credential: %w: %w", ErrUnauthorized, err)
	}
	if !ValidTenant(c.Tenant) || c.Subject == "" {
		return Identity{}, time.Time{}, fmt.Errorf("credential without tenant or cluster: %w", ErrUnauthorized)
	}
	id := Identity{Tenant: c.Tenant, ClusterID: c.Subject, Allow: PermWrite}
	if c.SealedID != "" {
		// Refused rather than accepted without the alias: its writes would
		// store the raw id wherever a series carries it, under a pseudonym
		// of the previous key. Authorizing again binds the current one.
		if i.Hasher == nil {
			return Identity{}, time.Time{}, fmt.Errorf("%w: no key", errSealedID)
		}
		raw, err := i.Hasher.sealer.open(c.SealedID, c.Subject)
		if err != nil {
			return Identity{}, time.Time{}, fmt.Errorf("%w: %w", errSealedID, err)
		}
		id.ClusterIDAlias = raw
	}
	return id, c.ExpiresAt.Time, nil
}

// looksLikeJWT tells a credential apart from a static token: three
// base64url segments separated by dots.
func looksLikeJWT(token string) bool { return strings.Count(token, ".") == 2 }

// Chain authenticates signed cluster credentials with Issuer and every
// other bearer token with Static.
type Chain struct {
	Issuer *Issuer // may be nil: no credentials are issued
	Static Authenticator
}

// Authenticate implements Authenticator.
func (c Chain) Authenticate(r *http.Request) (Identity, error) {
	token, ok := bearerToken(r)
	if ok && c.Issuer != nil && looksLikeJWT(token) {
		return c.Issuer.Verify(token)
	}
	if c.Static == nil {
		return Identity{}, fmt.Errorf("no static tokens configured: %w", ErrUnauthorized)
	}
	return c.Static.Authenticate(r)
}
