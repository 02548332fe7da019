package auth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// maxTelemeterBearer bounds the bearer of Telemeter's remote-write path
// before it is decoded; a pull-secret token is well under 2 KiB.
const maxTelemeterBearer = 16 << 10

// ParseTelemeterBearer decodes the bearer token of Telemeter's remote-write
// path, as cluster-monitoring-operator renders it for Prometheus:
// base64(JSON{"authorization_token": ..., "cluster_id": ...}). Padded and
// unpadded, standard and URL-safe base64 are accepted. Every error wraps
// ErrUnauthorized and never quotes the token.
func ParseTelemeterBearer(bearer string) (token, clusterID string, err error) {
	if len(bearer) > maxTelemeterBearer {
		return "", "", fmt.Errorf("telemeter bearer of %d bytes exceeds %d: %w", len(bearer), maxTelemeterBearer, ErrUnauthorized)
	}
	raw, err := decodeBase64(bearer)
	if err != nil {
		return "", "", fmt.Errorf("telemeter bearer is not base64: %w", ErrUnauthorized)
	}
	var v struct {
		AuthorizationToken string `json:"authorization_token"`
		ClusterID          string `json:"cluster_id"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", "", fmt.Errorf("telemeter bearer is not a JSON object with authorization_token and cluster_id: %w", ErrUnauthorized)
	}
	switch {
	case v.AuthorizationToken == "":
		return "", "", fmt.Errorf("telemeter bearer has no authorization_token: %w", ErrUnauthorized)
	case v.ClusterID == "":
		return "", "", fmt.Errorf("telemeter bearer has no cluster_id: %w", ErrUnauthorized)
	case !clusterIDRE.MatchString(v.ClusterID):
		return "", "", fmt.Errorf("telemeter bearer cluster_id must match %s: %w", clusterIDRE, ErrUnauthorized)
	}
	return v.AuthorizationToken, v.ClusterID, nil
}

func decodeBase64(s string) ([]byte, error) {
	s = strings.TrimRight(s, "=")
	if strings.ContainsAny(s, "-_") {
		return base64.RawURLEncoding.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(s)
}

// TelemeterOptions configures a TelemeterBearer.
type TelemeterOptions struct {
	// Hasher, when set, turns the cluster ids clusters send in clear into
	// pseudonyms before anything stores them.
	Hasher *ClusterIDHasher
	// CacheTTL is how long a positive answer of the fleet authorizer is
	// reused (default 5m): a revoked token keeps writing at most this long.
	CacheTTL time.Duration
	// CacheSize bounds the cached answers (default 100000).
	CacheSize int
	now       func() time.Time
}

// TelemeterBearer authenticates Telemeter's remote-write path
// (POST /metrics/v1/receive). The authorization_token is checked as a fleet
// token at /authorize would be; the identity it yields may only write, and
// only as the cluster_id it came with. Safe for concurrent use.
type TelemeterBearer struct {
	fleet   FleetAuthorizer
	opts    TelemeterOptions
	allowed *expiringCache[string] // tenants of (token, cluster id) digests
	lookups *prometheus.CounterVec
}

// NewTelemeterBearer returns the authenticator of Telemeter's remote-write
// path, checking tokens with fleet. reg may be nil.
func NewTelemeterBearer(reg prometheus.Registerer, fleet FleetAuthorizer, opts TelemeterOptions) *TelemeterBearer {
	if opts.CacheTTL <= 0 {
		opts.CacheTTL = 5 * time.Minute
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = 100_000
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	t := &TelemeterBearer{
		fleet: fleet, opts: opts, allowed: &expiringCache[string]{max: opts.CacheSize},
		lookups: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_auth_telemeter_token_checks_total",
			Help: "Telemeter remote-write credentials checked, by result (cached: a positive answer reused).",
		}, []string{"result"}),
	}
	for _, r := range []string{"cached", "authorized", "refused", "invalid", "upstream_error"} {
		t.lookups.WithLabelValues(r)
	}
	return t
}

// Authenticate implements Authenticator.
func (t *TelemeterBearer) Authenticate(r *http.Request) (Identity, error) {
	bearer, ok := bearerToken(r)
	if !ok {
		t.lookups.WithLabelValues("invalid").Inc()
		return Identity{}, fmt.Errorf("no bearer token: %w", ErrUnauthorized)
	}
	token, clusterID, err := ParseTelemeterBearer(bearer)
	if err != nil {
		t.lookups.WithLabelValues("invalid").Inc()
		return Identity{}, err
	}
	tenant, err := t.authorize(r.Context(), token, clusterID)
	if err != nil {
		return Identity{}, err
	}
	id := Identity{Tenant: tenant, ClusterID: clusterID, Allow: PermWrite}
	if h := t.opts.Hasher; h != nil {
		id.ClusterID = h.Pseudonym(clusterID)
		if id.ClusterID != clusterID {
			id.ClusterIDAlias = clusterID // series sent with the raw id are rewritten, never stored
		}
	}
	return id, nil
}

// authorize asks the fleet authorizer, or reuses its positive answer. The
// cache is keyed by a digest of token and cluster id, never the token.
func (t *TelemeterBearer) authorize(ctx context.Context, token, clusterID string) (string, error) {
	key := sha256.Sum256([]byte(token + "\x00" + clusterID))
	now := t.opts.now()
	if tenant, _, ok := t.allowed.get(key, now); ok {
		t.lookups.WithLabelValues("cached").Inc()
		return tenant, nil
	}
	tenant, err := t.fleet.AuthorizeFleet(ctx, token, clusterID)
	switch {
	case err == nil:
	case errors.Is(err, ErrUpstream):
		t.lookups.WithLabelValues("upstream_error").Inc()
		return "", err
	default:
		t.lookups.WithLabelValues("refused").Inc()
		return "", err
	}
	t.lookups.WithLabelValues("authorized").Inc()
	t.allowed.put(key, tenant, now.Add(t.opts.CacheTTL), now)
	return tenant, nil
}
