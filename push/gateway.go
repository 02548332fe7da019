// Package push is the receiver's aggregation push endpoint for one-shot jobs
// such as the installer: a Pushgateway-compatible path
// (PUT|POST /metrics/job/<job>{/<label>/<value>}) whose semantics are those of
// weaveworks' prom-aggregation-gateway. Counters and histograms with equal
// label sets (grouping labels included) are summed across pushes; gauges are
// summed or replaced (Config.GaugePolicy). Every accepted push is fsynced to
// a log before it is acknowledged, and the aggregated state is written into
// the tenant's TSDB every Config.FlushInterval, so it is queryable and
// shipped like remote-written data. push/client is the installer's client.
package push

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/storage"
)

// ReplicaLabel is the label that distinguishes the partial sums of receiver
// replicas on the aggregated series they write (Options.Replica). Pushes may
// not carry it. Queries and dashboards sum over it.
const ReplicaLabel = "push_replica"

// Options are the Gateway's optional dependencies.
type Options struct {
	// Now is the clock (rate limits, flush timestamps, expiry). Default time.Now.
	Now func() time.Time
	// Replica names this receiver among the replicas that share a bucket
	// (storage.external_labels.replica). When set, every aggregated series
	// is written with ReplicaLabel=Replica: each replica holds the partial
	// sum of the pushes it received, and the exact total is the sum over
	// ReplicaLabel. Empty (one receiver): no label is added.
	Replica string
	// Denied reports whether a cluster was erased and is refused until
	// re-admitted (storage.DB.Denied): its pushes are refused too, so the
	// state never aggregates its data again. Nil denies nothing.
	Denied func(tenant, clusterID string) bool
}

// Gateway is the push endpoint. It is an http.Handler that must be mounted
// behind auth.Middleware (it reads the tenant from auth.FromContext).
// ServeHTTP is safe for concurrent use; accepted pushes are serialised
// through one mutex and share fsyncs (group commit). Run writes the state into storage
// periodically; Close releases the log file after Run has returned.
type Gateway struct {
	logger  *slog.Logger
	w       storage.Writer
	cfg     Config
	now     func() time.Time
	metrics *metrics
	replica string
	denied  func(tenant, clusterID string) bool
	allowed map[string]bool
	limiter *limiter

	syncMu sync.Mutex // serialises fsyncs; held while waiting for one
	synced uint64     // the last Seq known durable (under syncMu)

	// flushMu is held through a whole Flush, copy and write, so that Erase
	// never runs between a flush's copy of the state and its write.
	flushMu sync.Mutex

	mu     sync.Mutex
	state  map[string]*tenantState // by tenant
	seq    uint64
	log    *durableLog
	broken error // set when the log can no longer be trusted
}

// Open recovers the durable state from dir (created if missing) and returns
// a Gateway writing to w. cfg must have passed Validate.
func Open(logger *slog.Logger, reg prometheus.Registerer, dir string, w storage.Writer, cfg Config, opts Options) (*Gateway, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	state, seq, l, err := openState(logger, dir, opts.Now().UnixMilli())
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		logger:  logger,
		w:       w,
		cfg:     cfg,
		now:     opts.Now,
		replica: opts.Replica,
		denied:  opts.Denied,
		allowed: make(map[string]bool, len(cfg.AllowedMetrics)),
		limiter: newLimiter(cfg.RateLimit),
		state:   state,
		seq:     seq,
		log:     l,
	}
	for _, n := range cfg.AllowedMetrics {
		g.allowed[n] = true
	}
	g.metrics = newMetrics(reg, func() float64 { return float64(g.seriesCount()) })
	return g, nil
}

func (g *Gateway) seriesCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, ts := range g.state {
		n += len(ts.Series)
	}
	return n
}

// accept validates rec's samples against the tenant's state, logs it durably
// and applies it. Nothing changes unless it returns nil.
func (g *Gateway) accept(rec *record) error {
	g.mu.Lock()
	err := g.appendLocked(rec)
	g.mu.Unlock()
	if err != nil {
		return err
	}
	return g.waitDurable(rec.Seq)
}

// waitDurable returns once record seq is fsynced. Callers queue on syncMu;
// one fsync covers every record written before it started, so the pushes
// that waited behind it return without another (group commit).
func (g *Gateway) waitDurable(seq uint64) error {
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	if g.synced >= seq {
		return nil
	}
	g.mu.Lock()
	target, broken := g.seq, g.broken
	g.mu.Unlock()
	if broken != nil {
		return fmt.Errorf("push log unusable: %w: %w", broken, errNotReady)
	}
	if err := g.log.sync(); err != nil {
		// What was written may or may not be on disk: stop acknowledging.
		g.mu.Lock()
		g.broken = err
		g.mu.Unlock()
		return err
	}
	g.synced = target
	return nil
}

// appendLocked validates rec against the tenant's state, writes it to the
// log and applies it. It is not durable until waitDurable(rec.Seq).
func (g *Gateway) appendLocked(rec *record) error {
	if g.broken != nil {
		return fmt.Errorf("push log unusable: %w: %w", g.broken, errNotReady)
	}
	ts := g.state[rec.Tenant]
	if ts == nil {
		ts = newTenantState()
	}
	for name, typ := range rec.Types {
		if have, ok := ts.Types[name]; ok && have != typ {
			return reject(reasonTypeMismatch, errInvalid, "metric %s was pushed as a %s before; this push has it as a %s", name, have, typ)
		}
	}
	for k, layout := range rec.Layouts {
		if have, ok := ts.Layouts[k]; ok && have != layout {
			return reject(reasonBucketMismatch, errInvalid, "histogram %s has buckets [%s] in the aggregate; this push has [%s]", k, have, layout)
		}
	}
	newSeries := map[string]bool{}
	sums := map[string]float64{} // what apply will store, to refuse an overflow before the log
	for _, d := range rec.Samples {
		k := seriesKey(d.Labels)
		it, ok := ts.Series[k]
		if !ok {
			newSeries[k] = true
		}
		sum, seen := sums[k]
		if !seen && ok {
			sum = it.Value
		}
		if d.Set {
			sum = 0
		}
		if sum += d.Value; math.IsInf(sum, 0) || math.IsNaN(sum) {
			return reject(reasonInvalidValue, errInvalid, "the aggregate of %s would overflow to %v; push smaller values", d.Labels, sum)
		}
		sums[k] = sum
	}
	if n := len(ts.Series) + len(newSeries); n > g.cfg.MaxSeriesPerTenant {
		return reject(reasonSeriesLimit, errInvalid, "push would create %d new series; the tenant's limit of %d aggregated series would be exceeded", len(newSeries), g.cfg.MaxSeriesPerTenant)
	}
	rec.Seq = g.seq + 1
	rec.Time = g.now().UnixMilli()
	if err := g.log.append(rec); err != nil {
		// The log was rewound; if that failed too, stop accepting.
		if errors.Is(err, errRewind) {
			g.broken = err
		}
		return err
	}
	g.seq = rec.Seq
	if g.state[rec.Tenant] == nil {
		g.state[rec.Tenant] = ts
	}
	ts.apply(rec)
	return nil
}

// Run writes the aggregated state into storage now and every FlushInterval
// until ctx is done, then once more, and compacts the log each time.
func (g *Gateway) Run(ctx context.Context) error {
	t := time.NewTicker(time.Duration(g.cfg.FlushInterval))
	defer t.Stop()
	for {
		g.Flush(context.WithoutCancel(ctx))
		select {
		case <-ctx.Done():
			g.Flush(context.WithoutCancel(ctx))
			return nil
		case <-t.C:
		}
	}
}

// Flush drops the series no push has touched for Config.SeriesTTL, compacts
// the log into a snapshot and writes every aggregated series with the
// current time (and ReplicaLabel, see Options.Replica) into its tenant's
// TSDB. Failures are logged and counted; the next flush retries.
func (g *Gateway) Flush(ctx context.Context) {
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	ts := g.now().UnixMilli()
	batches, err := g.compactAndCopy(ts)
	if err != nil {
		g.metrics.compactions.WithLabelValues("failure").Inc()
		g.logger.Error("compact push log", "err", err)
	}
	for tenant, series := range batches {
		stats, err := g.w.Write(ctx, tenant, series)
		g.metrics.flushedSamples.Add(float64(stats.Samples))
		if err != nil {
			g.metrics.flushes.WithLabelValues("failure").Inc()
			g.logger.Warn("write aggregated push state", "tenant", tenant, "series", len(series), "err", err)
			continue
		}
		g.metrics.flushes.WithLabelValues("success").Inc()
	}
}

func (g *Gateway) compactAndCopy(ts int64) (map[string][]prompb.TimeSeries, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	expired := 0
	cutoff := ts - time.Duration(g.cfg.SeriesTTL).Milliseconds()
	for tenant, st := range g.state {
		expired += st.expire(cutoff)
		if len(st.Series) == 0 && len(st.Layouts) == 0 {
			delete(g.state, tenant)
		}
	}
	g.metrics.expiredSeries.Add(float64(expired))
	var err error
	// Expiry changes the state without a log record: snapshot it too, or
	// a restart would bring the expired series back until the next flush.
	if (g.log.size > 0 || expired > 0) && g.broken == nil {
		if err = g.log.compact(g.state, g.seq); err == nil {
			g.metrics.compactions.WithLabelValues("success").Inc()
		}
	}
	out := make(map[string][]prompb.TimeSeries, len(g.state))
	for tenant, st := range g.state {
		if len(st.Series) == 0 {
			continue
		}
		series := make([]prompb.TimeSeries, 0, len(st.Series))
		for _, it := range st.Series {
			if math.IsNaN(it.Value) {
				continue
			}
			pl := make([]prompb.Label, 0, it.Labels.Len()+1)
			it.Labels.Range(func(l labels.Label) { pl = append(pl, prompb.Label{Name: l.Name, Value: l.Value}) })
			if g.replica != "" {
				pl = withReplica(pl, g.replica)
			}
			series = append(series, prompb.TimeSeries{Labels: pl, Samples: []prompb.Sample{{Value: it.Value, Timestamp: ts}}})
		}
		out[tenant] = series
	}
	return out, err
}

// withReplica sets ReplicaLabel in the sorted labels pl.
func withReplica(pl []prompb.Label, replica string) []prompb.Label {
	i, found := slices.BinarySearchFunc(pl, ReplicaLabel, func(l prompb.Label, name string) int { return strings.Compare(l.Name, name) })
	if found { // only in a state from before the label was reserved
		pl[i].Value = replica
		return pl
	}
	return slices.Insert(pl, i, prompb.Label{Name: ReplicaLabel, Value: replica})
}

// Close closes the log. Call it after Run has returned.
func (g *Gateway) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.log.close()
}
