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
// through one mutex and share fsyncs (group commit), and a push is applied
// to the state only once its fsync has succeeded: one that fails refuses
// every push not yet durable, and the log is rewritten (durableLog.reset). Run writes the state into storage
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

	// syncMu serialises fsyncs and settles their groups; held while waiting
	// for one. Lock order: flushMu, syncMu, mu.
	syncMu sync.Mutex

	// flushMu is held through a whole Flush, copy and writes, so that Erase
	// never runs between a flush's copy of the state and its writes (the
	// snapshot's, the TSDB's).
	flushMu sync.Mutex

	mu    sync.Mutex
	state map[string]*tenantState // by tenant; durable records only
	seq   uint64                  // the last Seq written to the log, durable or not
	log   *durableLog
	// broken is set while the log cannot take records: an fsync failed, or
	// a failed write could not be undone. Cleared by recoverLocked.
	broken error
	// pending are the records written but not yet durable, in Seq order;
	// pendingBy is what they will make of each tenant's state; group is the
	// commit group new records join (nil if none is open).
	pending   []*record
	pendingBy map[string]*pendingState
	group     *commitGroup
	// dropped counts the series dropped from the state since the labels
	// were last moved into a new symbol table (reinternLocked).
	dropped int
	// buildEvictOrder is buildEvictOrder, which flushed calls without mu;
	// tests replace it to hold a build.
	buildEvictOrder func(flushedSeq uint64, cands []evictCandidate) *evictOrder
	// flushStep is called between a flush's steps (compact.go); a no-op
	// but in tests, which pause a flush there or copy the files a crash
	// would leave. Set before the flush starts.
	flushStep func(flushStep)
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
		logger:    logger,
		w:         w,
		cfg:       cfg,
		now:       opts.Now,
		replica:   opts.Replica,
		denied:    opts.Denied,
		allowed:   make(map[string]bool, len(cfg.AllowedMetrics)),
		limiter:   newLimiter(cfg.RateLimit),
		state:     state,
		seq:       seq,
		log:       l,
		pendingBy: map[string]*pendingState{},

		buildEvictOrder: buildEvictOrder,
		flushStep:       func(flushStep) {},
	}
	for _, n := range cfg.AllowedMetrics {
		g.allowed[n] = true
	}
	g.metrics = newMetrics(reg, g.seriesByTenant)
	return g, nil
}

func (g *Gateway) seriesByTenant() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]int, len(g.state))
	for tenant, ts := range g.state {
		out[tenant] = len(ts.Series)
	}
	return out
}

func (g *Gateway) seriesCount() int {
	n := 0
	for _, c := range g.seriesByTenant() {
		n += c
	}
	return n
}

// accept validates rec's samples against the tenant's state, logs it durably
// and applies it. Nothing changes unless it returns nil.
func (g *Gateway) accept(rec *record) error {
	g.mu.Lock()
	grp, err := g.appendLocked(rec)
	g.mu.Unlock()
	if err != nil {
		return err
	}
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	if !grp.done { // else the fsync of a push queued before this one covered it
		g.commit()
	}
	return grp.err
}

// commit makes every record written so far durable with one fsync (group
// commit) and settles them. Called with syncMu held; mu is released during
// the fsync, so pushes go on writing records (the next group) meanwhile.
// The open group is the only one not settled, so it is the caller's.
func (g *Gateway) commit() {
	g.mu.Lock()
	grp, upto, size := g.group, g.seq, g.log.size
	g.group = nil
	g.mu.Unlock()
	err := g.log.sync()
	g.mu.Lock()
	g.settleLocked(grp, upto, size, err)
	g.mu.Unlock()
}

// commitLocked is commit holding mu throughout, for Flush and Erase: no
// record may be pending while they read or snapshot the state (a snapshot
// empties the log, pending records included). Called with syncMu and mu held.
func (g *Gateway) commitLocked() {
	if g.group == nil {
		return
	}
	grp, upto, size := g.group, g.seq, g.log.size
	g.group = nil
	g.settleLocked(grp, upto, size, g.log.sync())
}

// settleLocked ends the group whose fsync covered the records up to Seq upto
// (size bytes of the log). On success those records are applied to the
// state, in Seq order, and acknowledged. On failure every pending record is
// refused, those written after the fsync started too: the file can no longer
// be trusted (see durableLog.reset), so they could not be made durable
// there. None is applied, so the state holds exactly the acknowledged
// pushes, and the log is rewritten from it. Called with syncMu and mu held.
func (g *Gateway) settleLocked(grp *commitGroup, upto uint64, size int64, err error) {
	if err != nil {
		err = fmt.Errorf("push not stored: %w", err)
		for _, c := range []*commitGroup{grp, g.group} {
			if c != nil {
				c.done, c.err = true, err
			}
		}
		g.group, g.pending, g.pendingBy = nil, nil, map[string]*pendingState{}
		g.logFailedLocked(err)
		return
	}
	g.log.synced = size
	n := 0
	for _, rec := range g.pending {
		if rec.Seq > upto {
			break
		}
		ts := g.state[rec.Tenant]
		if ts == nil {
			ts = newTenantState()
			g.state[rec.Tenant] = ts
		}
		if ev := ts.apply(rec); ev > 0 {
			g.metrics.evicted.WithLabelValues(rec.Tenant).Add(float64(ev))
			g.dropped += ev // the table is renewed at the next flush (copyForFlush)
		}
		n++
	}
	g.pending = slices.Delete(g.pending, 0, n)
	g.pendingBy = map[string]*pendingState{}
	for _, rec := range g.pending {
		v := g.viewLocked(rec.Tenant)
		v.add(rec)
		g.pendingBy[rec.Tenant] = v.ps
	}
	grp.done = true
	if g.broken != nil && len(g.pending) == 0 {
		g.recoverLocked()
	}
}

// logFailedLocked stops the log taking records after a failure that leaves
// its content in doubt, and rewrites it at once if no record is pending
// (otherwise once the pending ones are settled: a rewrite holds the state
// only, and would drop them).
func (g *Gateway) logFailedLocked(err error) {
	g.broken = err
	g.metrics.logFailures.Inc()
	g.metrics.logUnusable.Set(1)
	if len(g.pending) == 0 {
		g.recoverLocked()
	}
}

// recoverLocked rewrites the log from the state (durableLog.reset) so that
// pushes are accepted again. If that fails too, pushes are refused with 503
// and the next Flush (or Erase) tries again. Called with mu held and no
// record pending.
func (g *Gateway) recoverLocked() {
	if err := g.log.reset(g.state, g.seq); err != nil {
		g.metrics.recoveries.WithLabelValues("failure").Inc()
		g.logger.Error("push log unusable, pushes refused until it is rewritten", "cause", g.broken, "err", err)
		return
	}
	g.metrics.recoveries.WithLabelValues("success").Inc()
	g.metrics.logUnusable.Set(0)
	g.logger.Warn("push log rewritten after a failure; the pushes it refused were not counted", "cause", g.broken)
	g.broken = nil
}

// viewLocked is the tenant's state as the pending records will leave it.
func (g *Gateway) viewLocked(tenant string) view {
	v := view{ts: g.state[tenant], ps: g.pendingBy[tenant]}
	if v.ts == nil {
		v.ts = newTenantState()
	}
	if v.ps == nil {
		v.ps = newPendingState()
	}
	return v
}

// appendLocked validates rec against the tenant's state and the records
// pending before it, and writes it to the log. It is applied to the state
// once the returned group's fsync succeeds (accept).
func (g *Gateway) appendLocked(rec *record) (*commitGroup, error) {
	if g.broken != nil {
		return nil, fmt.Errorf("push log unusable: %w: %w", g.broken, errNotReady)
	}
	v := g.viewLocked(rec.Tenant)
	for name, typ := range rec.Types {
		if have, ok := v.typeOf(name); ok && have != typ {
			return nil, reject(reasonTypeMismatch, errInvalid, "metric %s was pushed as a %s before; this push has it as a %s", name, have, typ)
		}
	}
	for k, layout := range rec.Layouts {
		if have, ok := v.layout(k); ok && have != layout {
			return nil, reject(reasonBucketMismatch, errInvalid, "histogram %s has buckets [%s] in the aggregate; this push has [%s]", k, have, layout)
		}
	}
	newSeries := map[string]bool{}
	sums := map[string]float64{} // what apply will store, to refuse an overflow before the log
	for _, d := range rec.Samples {
		k := seriesKey(d.Labels)
		sum, seen := sums[k]
		if !seen {
			var held bool
			if sum, held = v.value(k); !held {
				newSeries[k] = true
			}
		}
		if d.Set {
			sum = 0
		}
		if sum += d.Value; math.IsInf(sum, 0) || math.IsNaN(sum) {
			return nil, reject(reasonInvalidValue, errInvalid, "the aggregate of %s would overflow to %v; push smaller values", d.Labels, sum)
		}
		sums[k] = sum
	}
	now := g.now().UnixMilli()
	if need := v.series() + len(newSeries) - g.cfg.MaxSeriesPerTenant; need > 0 {
		if err := g.makeRoomLocked(rec, v, sums, need, len(newSeries), now); err != nil {
			g.metrics.budgetRefused.WithLabelValues(rec.Tenant).Inc()
			return nil, err
		}
	}
	rec.Seq = g.seq + 1
	rec.Time = now
	if err := g.log.append(rec); err != nil {
		// The log was cut back; if that failed too, stop accepting.
		if errors.Is(err, errRewind) {
			g.logFailedLocked(err)
		}
		return nil, err
	}
	g.seq = rec.Seq
	g.pending = append(g.pending, rec)
	v.add(rec)
	g.pendingBy[rec.Tenant] = v.ps
	if g.group == nil {
		g.group = &commitGroup{}
	}
	return g.group, nil
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
// TSDB. It holds the Gateway's mutex only to copy the state and to install
// the snapshot (compact.go). Failures are logged and counted; the next
// flush retries.
func (g *Gateway) Flush(ctx context.Context) {
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	ts := g.now().UnixMilli()
	fc := g.copyForFlush(ts)
	g.flushStep(stepCopied)
	if c := fc.compaction; c != nil {
		c.snap = fc.snapshot()
		if err := g.compact(c); err != nil {
			g.metrics.compactions.WithLabelValues("failure").Inc()
			g.logger.Error("compact push log", "err", err)
		}
	}
	for tenant, tc := range fc.tenants {
		if len(tc.series) == 0 {
			continue
		}
		series := g.samples(tc.series, ts)
		stats, err := g.w.Write(ctx, tenant, series)
		g.metrics.flushedSamples.Add(float64(stats.Samples))
		if err != nil {
			g.metrics.flushes.WithLabelValues("failure").Inc()
			g.logger.Warn("write aggregated push state", "tenant", tenant, "series", len(series), "err", err)
			continue
		}
		g.metrics.flushes.WithLabelValues("success").Inc()
		c := evictCopy{ts: tc.st}
		if tc.buildOrder {
			c.cands = evictCandidates(tc.layouts, tc.series)
		}
		g.flushed(fc.seq, c) // its series up to seq are stored: evictable
	}
}

// flushCopy is what a flush copies of the state under the Gateway's mutex,
// to work from without it.
type flushCopy struct {
	seq        uint64                 // the Seq the state is copied at, no record pending
	tenants    map[string]flushTenant // written into the TSDB and the snapshot
	compaction *compaction            // nil if the log needs none
}

// flushTenant is one tenant of a flushCopy.
type flushTenant struct {
	tenantCopy
	st         *tenantState // the tenant's state, whose eviction order the flush builds (Gateway.flushed)
	buildOrder bool         // false if the order as of the flush was built already
}

// copyForFlush expires the idle series and copies the state, and begins the
// log's compaction if it needs one.
func (g *Gateway) copyForFlush(ts int64) flushCopy {
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	// The snapshot and the copy hold exactly the acknowledged pushes: none
	// is pending. A log that failed before is rewritten now if it can be.
	g.commitLocked()
	if g.broken != nil {
		g.recoverLocked()
	}
	expired := 0
	cutoff := ts - time.Duration(g.cfg.SeriesTTL).Milliseconds()
	for tenant, st := range g.state {
		expired += st.expire(cutoff)
		if len(st.Series) == 0 && len(st.Layouts) == 0 {
			delete(g.state, tenant)
		}
	}
	g.metrics.expiredSeries.Add(float64(expired))
	g.noteDroppedLocked(expired) // and those evicted since the last flush
	fc := flushCopy{seq: g.seq, tenants: make(map[string]flushTenant, len(g.state))}
	for tenant, st := range g.state {
		fc.tenants[tenant] = flushTenant{
			tenantCopy: copyTenant(st),
			st:         st,
			buildOrder: st.evict == nil || st.evict.flushedSeq != g.seq, // else no record since the order was built
		}
	}
	// Expiry changes the state without a log record: snapshot it too, or
	// a restart would bring the expired series back until the next flush.
	if (g.log.size > 0 || expired > 0) && g.broken == nil {
		fc.compaction = g.log.begin(g.flushStep)
	}
	return fc
}

// snapshot is the copied state, to be written as the snapshot at its Seq.
func (fc flushCopy) snapshot() *snapshot {
	s := &snapshot{Seq: fc.seq, Tenants: make(map[string]snapshotEntry, len(fc.tenants))}
	for tenant, tc := range fc.tenants {
		s.Tenants[tenant] = tc.snapshotEntry()
	}
	return s
}

// compact writes the flush's snapshot without the Gateway's mutex, so that
// pushes and reads go on meanwhile, and installs it with the mutex
// (durableLog.install).
func (g *Gateway) compact(c *compaction) error {
	err := c.write(g.log.dir)
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.log.abandon(c)
		return err
	}
	// The records appended since the copy are kept in the log: settle them
	// first, so that those kept are acknowledged (a failure resets the log,
	// which voids the compaction).
	g.commitLocked()
	switch err = g.log.install(c); {
	case err == nil:
		g.metrics.compactions.WithLabelValues("success").Inc()
	case errors.Is(err, errSuperseded): // the reset's snapshot is newer
		g.logger.Debug("push snapshot dropped, the log was rewritten meanwhile", "seq", c.snap.Seq)
		return nil
	case errors.Is(err, errRewind):
		g.logFailedLocked(err)
	}
	return err
}

// samples are the flush's TSDB series of one tenant's copied series, at ts.
func (g *Gateway) samples(items map[string]*aggItem, ts int64) []prompb.TimeSeries {
	series := make([]prompb.TimeSeries, 0, len(items))
	for _, it := range items {
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
	return series
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
