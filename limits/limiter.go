// Package limits decides whether a tenant's cluster may write: active-series
// limits (per cluster, per tenant, per metric name), label limits, request
// size limits and sample-rate limits with bursts. Per-tenant overrides inherit
// the defaults, and the configuration can be swapped at run time without
// losing what is tracked.
//
// The package is pure: no HTTP, no storage. The receiver asks, and maps the
// *LimitError it gets back to a status code (see the Err* classes).
package limits

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Limiter enforces a Config. All methods are safe for concurrent use.
//
// Lifecycle: build it once with New, call Reload on a configuration change,
// and run Run (or call Expire periodically) so idle series stop counting.
// Tenants are tracked from their first write and never forgotten (their
// number is bounded by the credentials the receiver issues); their series,
// cluster names, metric names and rate buckets are.
//
// Strings passed in (tenant, cluster, metric) are copied before they are
// retained, so callers may pass views into a request buffer.
type Limiter struct {
	cfg     atomic.Pointer[resolved]
	now     func() time.Time
	epoch   time.Time // series last-seen times are seconds since epoch
	tenants sync.Map  // string → *tenant
	tracked atomic.Int64
	m       *metrics
	track   atomic.Pointer[tracker] // nil until TrackClusters (status.go)
}

// New returns a Limiter enforcing cfg, which should have passed Validate
// (unset fields take the built-in defaults whether or not SetDefaults was
// called). reg may be nil. now is the clock; nil means time.Now.
func New(reg prometheus.Registerer, cfg Config, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	l := &Limiter{now: now, epoch: now()}
	l.cfg.Store(cfg.resolve())
	l.m = newMetrics(reg, l)
	return l
}

// Reload swaps in cfg atomically. Requests already in flight finish under the
// configuration they started with. Tracked series, their counts and the rate
// buckets' fill levels are kept: a lowered series limit refuses new series
// while the existing ones keep passing, a raised one admits new series at
// once, and a changed rate or burst applies from now on (tokens earned
// before the reload were earned at the old rate).
func (l *Limiter) Reload(cfg Config) {
	r := cfg.resolve()
	l.cfg.Store(r)
	now := l.now()
	l.tenants.Range(func(_, v any) bool {
		v.(*tenant).syncRates(now, r)
		return true
	})
}

// For returns the effective limits of tenant: its override merged over the
// defaults, or the defaults if it has none.
func (l *Limiter) For(tenant string) TenantLimits {
	return *l.cfg.Load().forTenant(tenant)
}

// Run calls Expire every minute until ctx is done, then returns nil.
func (l *Limiter) Run(ctx context.Context) error {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			l.Expire()
		}
	}
}

// Expire forgets every series not written for longer than its tenant's
// series_idle_timeout, so its slot in the cluster, tenant and metric counts
// frees up, and garbage-collects cluster and metric names without series and
// cluster rate buckets that have refilled completely (dropping a full bucket
// changes nothing). It returns the number of series it forgot. With
// TrackClusters on, a cluster without series is kept until it has been
// silent for ClusterRetention, and the clusters' samples/s are updated once
// per RateWindow.
//
// It locks one series shard at a time, so writes to other shards proceed.
func (l *Limiter) Expire() int {
	now := l.now()
	nowSec := l.seconds(now)
	cfg := l.cfg.Load()
	var expired int
	l.tenants.Range(func(_, v any) bool {
		t := v.(*tenant)
		idle := cfg.forTenant(t.name).SeriesIdleTimeout / time.Second
		expired += t.expire(nowSec, uint32(min(idle, 1<<31)))
		t.gcRates(now)
		return true
	})
	l.tracked.Add(-int64(expired))
	l.m.expired.Add(float64(expired))
	l.rollRates(now)
	return expired
}

// seconds converts t to the compact series clock.
func (l *Limiter) seconds(t time.Time) uint32 {
	d := t.Sub(l.epoch)
	if d < 0 {
		return 0
	}
	return uint32(min(d/time.Second, 1<<32-2)) // the table stores seen+1 (table.go)
}

// tenant returns the state of name, creating it on first use.
func (l *Limiter) tenant(name string) *tenant {
	if v, ok := l.tenants.Load(name); ok {
		return v.(*tenant)
	}
	name = strings.Clone(name)
	v, _ := l.tenants.LoadOrStore(name, newTenant(name))
	return v.(*tenant)
}

func (l *Limiter) reject(limit string, value float64) *LimitError {
	l.m.rejected[limit].Inc()
	return &LimitError{Limit: limit, Value: value}
}

type metrics struct {
	rejected map[string]prometheus.Counter // immutable after newMetrics
	expired  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, l *Limiter) *metrics {
	f := promauto.With(reg)
	rejected := f.NewCounterVec(prometheus.CounterOpts{
		Name: "phonehome_limits_rejected_total",
		Help: "Refusals by limit: one per series for series and label limits, one per request for rate and size limits.",
	}, []string{"limit"})
	m := &metrics{
		rejected: make(map[string]prometheus.Counter),
		expired: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_limits_expired_series_total",
			Help: "Series forgotten after series_idle_timeout without writes.",
		}),
	}
	for _, name := range limitNames() {
		m.rejected[name] = rejected.WithLabelValues(name)
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "phonehome_limits_tracked_series",
		Help: "Active series counted towards the series limits, over all tenants.",
	}, func() float64 { return float64(l.tracked.Load()) })
	return m
}
