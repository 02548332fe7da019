package auth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"golang.org/x/sync/singleflight"
)

// maxTelemeterBearer bounds the bearer of Telemeter's remote-write path
// before it is decoded; a pull-secret token is well under 2 KiB.
const maxTelemeterBearer = 16 << 10

// ParseTelemeterBearer decodes the bearer token of Telemeter's remote-write
// path, as cluster-monitoring-operator renders it for Prometheus:
// base64(JSON{"authorization_token": ..., "cluster_id": ...}). Padded and
// unpadded, standard and URL-safe base64 are accepted. Every error is a
// *TelemeterBearerError (so ErrUnauthorized) and never quotes the token.
func ParseTelemeterBearer(bearer string) (token, clusterID string, err error) {
	if len(bearer) > maxTelemeterBearer {
		return "", "", &TelemeterBearerError{fmt.Sprintf("of %d bytes exceeds %d", len(bearer), maxTelemeterBearer)}
	}
	raw, err := decodeBase64(bearer)
	if err != nil {
		return "", "", &TelemeterBearerError{"is not base64"}
	}
	var v struct {
		AuthorizationToken string `json:"authorization_token"`
		ClusterID          string `json:"cluster_id"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", "", &TelemeterBearerError{"is not a JSON object with authorization_token and cluster_id"}
	}
	switch {
	case v.AuthorizationToken == "":
		return "", "", &TelemeterBearerError{"has no authorization_token"}
	case v.ClusterID == "":
		return "", "", &TelemeterBearerError{"has no cluster_id"}
	case !clusterIDRE.MatchString(v.ClusterID):
		return "", "", &TelemeterBearerError{"cluster_id must match " + clusterIDRE.String()}
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
	// NegativeCacheTTL is how long a refusal (ErrUnauthorized or
	// ErrForbidden, the webhook's 401 and 403) is reused (default 30s): a
	// token or cluster that becomes valid is accepted at most this much
	// later. Errors (ErrUpstream) are never cached.
	NegativeCacheTTL time.Duration
	// CacheSize bounds the positive and the negative answers, each
	// (default 100000), so refusals never push out a positive answer.
	CacheSize int
	// Logger, when set, logs the authorizer's failures (ErrUpstream: the
	// writer is answered 503), as /authorize does: at Warn once per
	// upstreamWarnEvery, else at Debug.
	Logger *slog.Logger
	now    func() time.Time
}

// Defaults of TelemeterOptions.
const (
	DefaultTelemeterCacheTTL         = 5 * time.Minute
	DefaultTelemeterNegativeCacheTTL = 30 * time.Second
	DefaultTelemeterCacheSize        = 100_000
)

// maxTelemeterLookup bounds a lookup that no request waits for any more
// (every waiting client went away, or it is a refresh), in case the fleet
// authorizer has no timeout of its own.
const maxTelemeterLookup = time.Minute

// TelemeterBearer authenticates Telemeter's remote-write path
// (POST /metrics/v1/receive). The authorization_token is checked as a fleet
// token at /authorize would be; the identity it yields may only write, and
// only as the cluster_id it came with. Safe for concurrent use.
//
// Answers of the fleet authorizer are cached by a digest of the token and
// the cluster's ids, as Kubernetes' cached token authenticator does:
// positive ones for CacheTTL, refusals for NegativeCacheTTL, in two caches
// of CacheSize entries each. Concurrent checks of the same bearer share one lookup. A
// positive answer in the last quarter of its TTL is looked up again in the
// background by the next check, which does not wait for it: a cluster that
// keeps writing is never held up by the lookup, nor refused for a busy or
// failing authorizer before its answer has expired.
type TelemeterBearer struct {
	fleet    FleetAuthorizer
	opts     TelemeterOptions
	allowed  expiringCache[string] // tenants of (token, sent id, stored id) digests
	refused  expiringCache[error]  // ErrUnauthorized or ErrForbidden, by the same digests
	group    singleflight.Group    // lookups in flight, by digest
	checks   *prometheus.CounterVec
	lookups  *prometheus.CounterVec
	upstream upstreamLog // Options.Logger's
}

// NewTelemeterBearer returns the authenticator of Telemeter's remote-write
// path, checking tokens with fleet. reg may be nil.
func NewTelemeterBearer(reg prometheus.Registerer, fleet FleetAuthorizer, opts TelemeterOptions) *TelemeterBearer {
	if opts.CacheTTL <= 0 {
		opts.CacheTTL = DefaultTelemeterCacheTTL
	}
	if opts.NegativeCacheTTL <= 0 {
		opts.NegativeCacheTTL = DefaultTelemeterNegativeCacheTTL
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = DefaultTelemeterCacheSize
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	f := promauto.With(reg)
	t := &TelemeterBearer{
		fleet: fleet, opts: opts, upstream: upstreamLog{logger: opts.Logger, now: opts.now},
		allowed: expiringCache[string]{max: opts.CacheSize},
		refused: expiringCache[error]{max: opts.CacheSize},
		checks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_auth_telemeter_token_checks_total",
			Help: "Telemeter remote-write credentials checked, by result (cached, cached_refused: a cached answer reused).",
		}, []string{"result"}),
		lookups: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_auth_telemeter_token_lookups_total",
			Help: "Lookups at the fleet authorizer for Telemeter remote-write credentials (one per cache miss or refresh; concurrent checks share one), by result.",
		}, []string{"result"}),
	}
	for _, r := range []string{"cached", "cached_refused", "authorized", "refused", "invalid", "upstream_error"} {
		t.checks.WithLabelValues(r)
	}
	for _, r := range []string{"authorized", "refused", "upstream_error"} {
		t.lookups.WithLabelValues(r)
	}
	for answer, c := range map[string]interface{ len() int }{"authorized": &t.allowed, "refused": &t.refused} {
		f.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "phonehome_auth_telemeter_token_cache_entries",
			Help:        "Cached answers of the fleet authorizer for Telemeter remote-write credentials, by answer (expired ones until evicted).",
			ConstLabels: prometheus.Labels{"answer": answer},
		}, func() float64 { return float64(c.len()) })
	}
	return t
}

// Authenticate implements Authenticator.
func (t *TelemeterBearer) Authenticate(r *http.Request) (Identity, error) {
	bearer, ok := bearerToken(r)
	if !ok {
		t.checks.WithLabelValues("invalid").Inc()
		return Identity{}, fmt.Errorf("no bearer token: %w", ErrUnauthorized)
	}
	token, clusterID, err := ParseTelemeterBearer(bearer)
	if err != nil {
		t.checks.WithLabelValues("invalid").Inc()
		return Identity{}, err
	}
	cluster, err := t.opts.Hasher.ids(clusterID)
	if err != nil {
		t.checks.WithLabelValues("invalid").Inc()
		return Identity{}, fmt.Errorf("telemeter bearer cluster_id: %w: %w", err, ErrUnauthorized)
	}
	tenant, err := t.authorize(r.Context(), token, cluster)
	switch {
	case errors.Is(err, ErrUpstream): // an authorizer that could not answer: 503
		if r.Context().Err() == nil { // not a writer that went away
			t.upstream.log(r.Context(), err, cluster)
		}
		return Identity{}, err
	case err != nil: // a refusal (401, 403)
		return Identity{}, fmt.Errorf("%w: %w", errFleetRefused, err)
	}
	id := Identity{Tenant: tenant, ClusterID: cluster.Stored, Allow: PermWrite}
	if cluster.Stored != cluster.Sent {
		id.ClusterIDAlias = cluster.Sent // series sent with the raw id are rewritten, never stored
	}
	return id, nil
}

// authorize answers from the caches, or asks the fleet authorizer (one
// lookup per digest at a time). The caches are keyed by a digest of the
// token and both ids the authorizer is asked about, never the token.
func (t *TelemeterBearer) authorize(ctx context.Context, token string, cluster ClusterIDs) (string, error) {
	key := sha256.Sum256([]byte(token + "\x00" + cluster.Sent + "\x00" + cluster.Stored))
	now := t.opts.now()
	if tenant, exp, ok := t.allowed.get(key, now); ok {
		if exp.Sub(now) < t.opts.CacheTTL/4 {
			t.lookup(ctx, key, token, cluster) // refresh ahead; nobody waits for it
		}
		t.checks.WithLabelValues("cached").Inc()
		return tenant, nil
	}
	if err, _, ok := t.refused.get(key, now); ok {
		t.checks.WithLabelValues("cached_refused").Inc()
		return "", err
	}
	select {
	case res := <-t.lookup(ctx, key, token, cluster):
		t.checks.WithLabelValues(lookupResult(res.Err)).Inc()
		if res.Err != nil {
			return "", res.Err
		}
		return res.Val.(string), nil
	case <-ctx.Done():
		t.checks.WithLabelValues("upstream_error").Inc()
		return "", fmt.Errorf("waiting for the fleet authorizer: %w: %w", ErrUpstream, ctx.Err())
	}
}

// lookup asks the fleet authorizer unless a lookup of key is in flight, and
// caches its answer. The lookup outlives ctx's cancellation (others may wait
// for it) but not maxTelemeterLookup. An entry expires one TTL after the
// lookup started, so it never outlives the answer by more than its TTL.
func (t *TelemeterBearer) lookup(ctx context.Context, key [sha256.Size]byte, token string, cluster ClusterIDs) <-chan singleflight.Result {
	ctx = context.WithoutCancel(ctx)
	return t.group.DoChan(string(key[:]), func() (any, error) {
		ctx, cancel := context.WithTimeout(ctx, maxTelemeterLookup)
		defer cancel()
		start := t.opts.now()
		tenant, err := t.fleet.AuthorizeFleet(ctx, token, cluster)
		t.lookups.WithLabelValues(lookupResult(err)).Inc()
		switch {
		case err == nil:
			t.refused.remove(key)
			t.allowed.put(key, tenant, start.Add(t.opts.CacheTTL), start)
		case errors.Is(err, ErrUnauthorized), errors.Is(err, ErrForbidden):
			t.allowed.remove(key) // revoked: refused from now on, not at expiry
			t.refused.put(key, err, start.Add(t.opts.NegativeCacheTTL), start)
		}
		return tenant, err
	})
}

// lookupResult names the answer of a lookup in the metrics.
func lookupResult(err error) string {
	switch {
	case err == nil:
		return "authorized"
	case errors.Is(err, ErrUpstream):
		return "upstream_error"
	default:
		return "refused"
	}
}
