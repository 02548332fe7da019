package limits

import (
	"math"
	"strings"
	"time"

	"golang.org/x/time/rate"
)

// bucket is a token bucket and the configuration it was last set from.
type bucket struct {
	lim *rate.Limiter
	cfg *resolved
	// owed is the size of the last request of this bucket's owner (its
	// cluster, or a credential bound to no cluster on the tenant's bucket)
	// that was refused for its rate, 0 once a request has been paid for.
	// CheckExhausted refuses the owner until both buckets hold that much
	// again: that is when the Retry-After it was given runs out.
	owed int
}

// sync applies a reloaded rate or burst, keeping the current fill level.
func (b *bucket) sync(now time.Time, cfg *resolved, r float64, burst int) {
	if b.cfg == cfg {
		return
	}
	b.cfg = cfg
	if b.lim.Limit() != rate.Limit(r) {
		b.lim.SetLimitAt(now, rate.Limit(r))
	}
	if b.lim.Burst() != burst {
		b.lim.SetBurstAt(now, burst)
	}
}

// maxRetryAfter caps a Retry-After in seconds (68 years): a wait for a very
// low rate could otherwise overflow time.Duration and turn into 1s.
const maxRetryAfter = math.MaxInt32

// AllowSamples takes n samples from the token buckets of cluster and of
// tenant. Each bucket holds up to its burst, starts full and refills at its
// samples_per_second; a rate of 0 disables that bucket. An empty cluster
// (a credential not bound to one cluster) uses the tenant bucket only.
//
// If both buckets hold enough, it takes n from each and returns (0, nil).
// Otherwise it takes nothing and returns a *LimitError (ErrRateLimited) for
// the bucket that is short longest, and retryAfter: how long until both could
// give n, rounded up to whole seconds and at least 1s, for Retry-After; it
// remembers n, so that CheckExhausted refuses the cluster until then.
//
// A request larger than a bucket's burst can never be paid for and is
// refused with a *LimitError wrapping ErrTooLarge (burst_per_cluster or
// burst_per_tenant), so one huge request cannot exceed the configured rate.
//
// Both buckets are checked and taken under one per-tenant lock, so a refused
// request consumes nothing even under concurrency (rate.Limiter's
// Reserve/Cancel only restores tokens approximately once other reservations
// intervene). The lock is per request, not per sample.
func (l *Limiter) AllowSamples(tenant, cluster string, n int) (retryAfter time.Duration, err error) {
	return l.samples(tenant, cluster, n, true)
}

// MaxSamplesPerRequest is the most samples one request can carry and still
// be admitted by AllowSamples (the bursts of the buckets that apply to it;
// cluster: the request is bound to a cluster); 0: no bound. The receiver
// stops decoding a request past it.
func (l TenantLimits) MaxSamplesPerRequest(cluster bool) int {
	n := 0
	if l.SamplesPerSecondPerCluster > 0 && cluster {
		n = l.BurstPerCluster
	}
	if l.SamplesPerSecondPerTenant > 0 && (n == 0 || l.BurstPerTenant < n) {
		n = l.BurstPerTenant
	}
	return n
}

// CheckExhausted refuses a cluster (or a credential bound to no cluster) that
// was told to wait, and takes nothing. The receiver calls it before it reads
// and decodes a body, so a client over its rate costs next to nothing.
//
// It refuses while the cluster's last request was refused by AllowSamples
// and the buckets do not yet hold what that request needed, with
// retryAfter: how long until they do, which is when the Retry-After the
// cluster was given runs out. Without it a client that ignores Retry-After
// gets every request decoded.
//
// It does not refuse on an empty bucket alone: the size of the request is
// not known before its body is decoded, so neither is how long it has to
// wait, and a Retry-After of the time until one sample fits (1s) would only
// bring the request back early, to be refused again with the real wait.
// Such a request is decoded, and AllowSamples answers its exact wait.
func (l *Limiter) CheckExhausted(tenant, cluster string) (retryAfter time.Duration, err error) {
	return l.samples(tenant, cluster, 0, false)
}

// samples is AllowSamples (take) and CheckExhausted (!take, n == 0: the
// request's size is not known yet, the owner's owed stands in for it).
func (l *Limiter) samples(tenant, cluster string, n int, take bool) (retryAfter time.Duration, err error) {
	cfg := l.cfg.Load()
	lim := cfg.forTenant(tenant)
	if (take && n <= 0) || (lim.SamplesPerSecondPerCluster <= 0 && lim.SamplesPerSecondPerTenant <= 0) {
		return 0, nil
	}
	now := l.now()
	t := l.tenant(tenant)
	t.rateMu.Lock()
	defer t.rateMu.Unlock()

	var (
		cb, tb *rate.Limiter
		cbk    *bucket
	)
	if lim.SamplesPerSecondPerCluster > 0 && cluster != "" { // "": no cluster, tenant bucket only
		cbk = t.clusterRates[cluster]
		if cbk == nil {
			cbk = &bucket{lim: rate.NewLimiter(rate.Limit(lim.SamplesPerSecondPerCluster), lim.BurstPerCluster), cfg: cfg}
			t.clusterRates[strings.Clone(cluster)] = cbk
		}
		cbk.sync(now, cfg, lim.SamplesPerSecondPerCluster, lim.BurstPerCluster)
		cb = cbk.lim
	}
	if lim.SamplesPerSecondPerTenant > 0 {
		if t.rate == nil {
			t.rate = &bucket{lim: rate.NewLimiter(rate.Limit(lim.SamplesPerSecondPerTenant), lim.BurstPerTenant), cfg: cfg}
		}
		t.rate.sync(now, cfg, lim.SamplesPerSecondPerTenant, lim.BurstPerTenant)
		tb = t.rate.lim
	}

	owner := cbk // whose refused request is remembered (owed)
	if cluster == "" {
		owner = t.rate
	}
	if !take {
		if owner == nil || owner.owed == 0 {
			return 0, nil // nothing refused yet: the size of this request decides (AllowSamples)
		}
		n = owner.owed
	}

	// A request larger than a bucket's burst could never be paid for: refuse
	// it as too large (413) rather than let it pass on a full bucket.
	if take && cb != nil && n > lim.BurstPerCluster {
		return 0, l.reject(LimitBurstPerCluster, float64(lim.BurstPerCluster))
	}
	if take && tb != nil && n > lim.BurstPerTenant {
		return 0, l.reject(LimitBurstPerTenant, float64(lim.BurstPerTenant))
	}
	var (
		wait  float64 // seconds: as a Duration, a low rate's wait overflows
		limit string
		value float64
	)
	short := func(b *rate.Limiter, name string, r float64, burst int, n int) {
		if b == nil {
			return
		}
		need := float64(min(n, burst)) // owed may exceed a burst lowered since
		if have := b.TokensAt(now); have < need {
			if d := (need - have) / r; limit == "" || d > wait {
				wait, limit, value = d, name, r
			}
		}
	}
	short(cb, LimitSamplesPerSecondCluster, lim.SamplesPerSecondPerCluster, lim.BurstPerCluster, n)
	short(tb, LimitSamplesPerSecondTenant, lim.SamplesPerSecondPerTenant, lim.BurstPerTenant, n)
	if limit != "" {
		if take && owner != nil {
			owner.owed = n // n <= burst, checked above
		}
		secs := min(max(math.Ceil(wait), 1), maxRetryAfter)
		return time.Duration(secs) * time.Second, l.reject(limit, value)
	}
	if !take {
		return 0, nil
	}
	// Both hold enough, and the lock keeps it so: these cannot fail.
	if cb != nil {
		cb.AllowN(now, min(n, lim.BurstPerCluster))
	}
	if owner != nil {
		owner.owed = 0
	}
	if tb != nil {
		tb.AllowN(now, min(n, lim.BurstPerTenant))
	}
	return 0, nil
}

// syncRates applies cfg to t's existing buckets.
func (t *tenant) syncRates(now time.Time, cfg *resolved) {
	lim := cfg.forTenant(t.name)
	t.rateMu.Lock()
	defer t.rateMu.Unlock()
	if t.rate != nil {
		t.rate.sync(now, cfg, lim.SamplesPerSecondPerTenant, lim.BurstPerTenant)
	}
	for _, b := range t.clusterRates {
		b.sync(now, cfg, lim.SamplesPerSecondPerCluster, lim.BurstPerCluster)
	}
}

// gcRates drops cluster buckets that have refilled: a new bucket starts full,
// so dropping a full one changes nothing. Buckets whose rate is now
// unlimited are dropped too (they start full if the limit comes back).
func (t *tenant) gcRates(now time.Time) {
	t.rateMu.Lock()
	defer t.rateMu.Unlock()
	for name, b := range t.clusterRates {
		if b.lim.Limit() <= 0 || b.lim.TokensAt(now) >= float64(b.lim.Burst()) {
			delete(t.clusterRates, name)
		}
	}
}
