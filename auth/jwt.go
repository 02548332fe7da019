package auth

import (
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
	jwt.RegisteredClaims
}

// Issuer signs and verifies short-lived cluster credentials.
type Issuer struct {
	keys *KeySet
	ttl  time.Duration
	now  func() time.Time
}

// NewIssuer returns an Issuer signing with the newest key of keys.
// now may be nil (time.Now).
func NewIssuer(keys *KeySet, ttl time.Duration, now func() time.Time) *Issuer {
	if now == nil {
		now = time.Now
	}
	return &Issuer{keys: keys, ttl: ttl, now: now}
}

// Issue signs a credential binding tenant and clusterID, valid for the TTL.
func (i *Issuer) Issue(tenant, clusterID string) (string, time.Time, error) {
	now := i.now()
	exp := now.Add(i.ttl)
	k := i.keys.newestKey()
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, Claims{
		Tenant: tenant,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    jwtIssuer,
			Subject:   clusterID,
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
func (i *Issuer) Verify(token string) (Identity, error) {
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		pub, ok := i.keys.byID[kid]
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
	if err != nil {
		return Identity{}, fmt.Errorf("credential: %w: %w", ErrUnauthorized, err)
	}
	if !ValidTenant(c.Tenant) || c.Subject == "" {
		return Identity{}, fmt.Errorf("credential without tenant or cluster: %w", ErrUnauthorized)
	}
	return Identity{Tenant: c.Tenant, ClusterID: c.Subject, Allow: PermWrite}, nil
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
		return Identity{}, errors.New("no static tokens configured: " + ErrUnauthorized.Error())
	}
	return c.Static.Authenticate(r)
}
