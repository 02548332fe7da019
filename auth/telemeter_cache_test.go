package auth

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// registry is a fleet authorizer whose clusters can be registered while a
// test runs; it counts its lookups.
type registry struct {
	mu       sync.Mutex
	clusters map[string]error // cluster id -> nil (known), ErrForbidden, ErrUpstream, ...
	calls    atomic.Int64
}

func (r *registry) set(clusterID string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clusters[clusterID] = err
}

func (r *registry) AuthorizeFleet(_ context.Context, token string, cluster ClusterIDs) (string, error) {
	r.calls.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	err, ok := r.clusters[cluster.Stored]
	switch {
	case token != "fleet" || !ok:
		return "", fmt.Errorf("unknown: %w", ErrUnauthorized)
	case err != nil:
		return "", err
	}
	return "acme", nil
}

// TestTelemeterBearerCachesRefusals: a refusal (401/403) is reused for the
// negative TTL, so a bearer sent again and again costs one lookup per TTL;
// a cluster registered meanwhile is accepted at most one negative TTL after
// the refusal. Errors of the authorizer are never cached.
func TestTelemeterBearerCachesRefusals(t *testing.T) {
	clock := newClock()
	fleet := &registry{clusters: map[string]error{"known": nil, "banned": fmt.Errorf("no: %w", ErrForbidden), "flaky": fmt.Errorf("502: %w", ErrUpstream)}}
	reg := prometheus.NewRegistry()
	a := NewTelemeterBearer(reg, fleet, TelemeterOptions{NegativeCacheTTL: 30 * time.Second, now: clock.Now})
	check := func(token, clusterID string) error {
		_, err := a.Authenticate(bearerReq(telemeterBearer(token, clusterID)))
		return err
	}

	for range 3 {
		require.ErrorIs(t, check("fleet", "new"), ErrUnauthorized)
		require.ErrorIs(t, check("fleet", "banned"), ErrForbidden, "the refusal is kept as it was: 403")
		require.ErrorIs(t, check("made-up", "known"), ErrUnauthorized)
	}
	require.EqualValues(t, 3, fleet.calls.Load(), "one lookup per refused bearer")
	require.InDelta(t, 6, testutil.ToFloat64(a.checks.WithLabelValues("cached_refused")), 0)
	require.InDelta(t, 3, testutil.ToFloat64(a.checks.WithLabelValues("refused")), 0)

	fleet.set("new", nil) // the cluster registers
	clock.Advance(29 * time.Second)
	require.ErrorIs(t, check("fleet", "new"), ErrUnauthorized, "still the cached refusal")
	clock.Advance(time.Second)
	require.NoError(t, check("fleet", "new"), "accepted one negative TTL after the refusal")
	require.NoError(t, check("fleet", "new"))
	require.EqualValues(t, 4, fleet.calls.Load())

	for range 2 {
		require.ErrorIs(t, check("fleet", "flaky"), ErrUpstream)
	}
	require.EqualValues(t, 6, fleet.calls.Load(), "upstream errors are not cached")

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP phonehome_auth_telemeter_token_cache_entries Cached answers of the fleet authorizer for Telemeter remote-write credentials, by answer (expired ones until evicted).
# TYPE phonehome_auth_telemeter_token_cache_entries gauge
phonehome_auth_telemeter_token_cache_entries{answer="authorized"} 1
phonehome_auth_telemeter_token_cache_entries{answer="refused"} 2
# HELP phonehome_auth_telemeter_token_lookups_total Lookups at the fleet authorizer for Telemeter remote-write credentials (one per cache miss or refresh; concurrent checks share one), by result.
# TYPE phonehome_auth_telemeter_token_lookups_total counter
phonehome_auth_telemeter_token_lookups_total{result="authorized"} 1
phonehome_auth_telemeter_token_lookups_total{result="refused"} 3
phonehome_auth_telemeter_token_lookups_total{result="upstream_error"} 2
`), "phonehome_auth_telemeter_token_cache_entries", "phonehome_auth_telemeter_token_lookups_total"))
}

// TestTelemeterBearerRefusalsAreBounded: made-up bearers fill only the
// negative cache, up to its bound, and never push out a positive answer.
func TestTelemeterBearerRefusalsAreBounded(t *testing.T) {
	fleet := &registry{clusters: map[string]error{"known": nil}}
	a := NewTelemeterBearer(nil, fleet, TelemeterOptions{CacheSize: 100})
	_, err := a.Authenticate(bearerReq(telemeterBearer("fleet", "known")))
	require.NoError(t, err)
	for i := range 1000 {
		_, err := a.Authenticate(bearerReq(telemeterBearer(fmt.Sprint("made-up-", i), "known")))
		require.ErrorIs(t, err, ErrUnauthorized)
		require.LessOrEqual(t, a.refused.len(), 100)
	}
	require.Greater(t, a.refused.len(), 80, "refusals are cached up to the bound")
	_, err = a.Authenticate(bearerReq(telemeterBearer("fleet", "known")))
	require.NoError(t, err)
	require.EqualValues(t, 1001, fleet.calls.Load(), "the known bearer's answer is still cached")
}

// TestTelemeterBearerSharesLookups: concurrent checks of one bearer (a
// cluster's two Prometheus replicas) share one lookup, and a check whose
// client goes away neither cancels it for the others nor waits for it.
func TestTelemeterBearerSharesLookups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		release := make(chan struct{})
		a := NewTelemeterBearer(nil, fleetFunc(func(ctx context.Context, _ string, _ ClusterIDs) (string, error) {
			calls.Add(1)
			<-release
			if err := ctx.Err(); err != nil {
				return "", fmt.Errorf("%w: %w", ErrUpstream, err)
			}
			return "acme", nil
		}), TelemeterOptions{})
		bearer := telemeterBearer("fleet", "c1")

		ctx, cancel := context.WithCancel(context.Background())
		gone := make(chan error, 1)
		go func() {
			_, err := a.Authenticate(bearerReq(bearer).WithContext(ctx))
			gone <- err
		}()
		synctest.Wait() // the first check's lookup is waiting for the authorizer
		errs := make(chan error, 10)
		for range 10 {
			go func() {
				_, err := a.Authenticate(bearerReq(bearer))
				errs <- err
			}()
		}
		synctest.Wait()
		require.EqualValues(t, 1, calls.Load(), "one lookup for eleven checks")

		cancel()
		require.ErrorIs(t, <-gone, ErrUpstream, "a check whose client went away stops waiting (503)")
		close(release)
		for range 10 {
			require.NoError(t, <-errs, "the lookup was not cancelled with the first client")
		}
		require.InDelta(t, 10, testutil.ToFloat64(a.checks.WithLabelValues("authorized")), 0)
		require.InDelta(t, 1, testutil.ToFloat64(a.lookups.WithLabelValues("authorized")), 0)
	})
}

// TestTelemeterBearerRefreshesAhead: a positive answer in the last quarter
// of its TTL is looked up again in the background. While that lookup fails
// (the authorizer is down or at its lookup cap) the cached answer keeps
// serving until it expires; once it succeeds the cluster is never held up
// at expiry; a refusal takes effect at once.
func TestTelemeterBearerRefreshesAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newClock()
		fleet := &registry{clusters: map[string]error{"c1": nil}}
		a := NewTelemeterBearer(nil, fleet, TelemeterOptions{CacheTTL: 4 * time.Minute, now: clock.Now})
		check := func() error {
			_, err := a.Authenticate(bearerReq(telemeterBearer("fleet", "c1")))
			synctest.Wait() // the refresh, if any, has run
			return err
		}
		require.NoError(t, check())
		clock.Advance(3 * time.Minute)
		require.NoError(t, check())
		require.EqualValues(t, 1, fleet.calls.Load(), "no refresh before the last quarter")

		fleet.set("c1", fmt.Errorf("64 lookups in flight: %w", ErrUpstream))
		clock.Advance(time.Second)
		require.NoError(t, check(), "the cached answer serves while the refresh fails")
		require.EqualValues(t, 2, fleet.calls.Load())
		fleet.set("c1", nil)
		require.NoError(t, check())
		require.EqualValues(t, 3, fleet.calls.Load(), "refreshed")

		fleet.set("c1", fmt.Errorf("64 lookups in flight: %w", ErrUpstream))
		clock.Advance(time.Minute) // past the first answer's expiry
		require.NoError(t, check(), "the refreshed answer serves, though the authorizer is busy")
		require.EqualValues(t, 3, fleet.calls.Load())

		fleet.set("c1", fmt.Errorf("revoked: %w", ErrUnauthorized))
		clock.Advance(2*time.Minute + time.Second) // in the refreshed answer's last quarter
		require.NoError(t, check(), "served while the refresh runs")
		require.ErrorIs(t, check(), ErrUnauthorized, "the refusal takes effect before the answer expires")
		require.EqualValues(t, 4, fleet.calls.Load())
	})
}
