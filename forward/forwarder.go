// Package forward is the forwarding loop of the in-cluster forwarder:
// federate from Prometheus, enforce the allowlist, relabel and anonymize,
// batch into remote-write requests, queue them durably on disk, and deliver
// them oldest first with retry and backoff.
package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/relabel"
)

// Drop and filter reasons (values of the reason label). A queued record
// whose samples cannot be counted is counted as a record instead, in
// phonehome_forward_dropped_records_total{reason="corrupt"|"invalid"}.
const (
	ReasonAllowlist      = "allowlist"        // filtered: not selected by the allowlist
	ReasonRelabel        = "relabel"          // filtered: dropped by relabel_configs
	ReasonMaxSeries      = "max_series"       // dropped: over the per-cycle series cap
	ReasonSelectorCap    = "selector_cap"     // dropped: over a gathering definition's per-selector cap
	ReasonMaxBytes       = "max_bytes"        // dropped: after the federate response byte cap
	ReasonQueueFull      = "queue_full"       // dropped: oldest data evicted from a full queue
	ReasonRecordTooLarge = "record_too_large" // dropped: one request larger than the whole queue
	ReasonQueueError     = "queue_error"      // dropped: the queue could not store the cycle
	ReasonHTTP4xx        = "http_4xx"         // dropped: the receiver rejected the request (not 429)
	ReasonInvalid        = "invalid"          // dropped: a request could not be encoded or converted; a queued record could not be decoded
	ReasonCorrupt        = "corrupt"          // dropped record: unreadable on disk (torn write, disk fault)
	ReasonPartialWrite   = "partial_write"    // dropped: a 2xx whose written counts are below what was sent
	ReasonSuperseded     = "superseded"       // dropped: a queued cycle a later one replaces, for a server that stores uploads at their arrival (snapshots)
)

// Policy is what may leave the cluster and how it is rewritten. Allow and
// Rules are required.
type Policy struct {
	Allow *allowlist.List
	Rules *relabel.Rules
	// Caps limit the series per selector and cycle (from a gathering definition).
	Caps []gathering.Cap
	// DefinitionVersion, if set, is forwarded every cycle as
	// gathering.InfoMetric{version="..."} 1.
	DefinitionVersion string
}

// MatchingSource is a Source that can fetch with the selectors of the
// policy in force for the cycle (the Federator's match[] parameters), so a
// new policy applies to federation and filtering at once.
type MatchingSource interface {
	FetchMatching(ctx context.Context, matches []string, fn func(*Sample) error) (FetchStats, error)
}

// ErrNoPolicy is returned by Collect while no policy is in force.
var ErrNoPolicy = errors.New("no gathering policy in force yet")

// DefaultInterval is the time between collections when Options.Interval
// is unset, and the --interval default: telemeter-client's.
const DefaultInterval = 4*time.Minute + 30*time.Second

// Options tunes a Forwarder. Zero values take the documented defaults.
type Options struct {
	Interval time.Duration // between collections (default DefaultInterval)
	// Jitter spreads the work of forwarders that start together: each wait
	// between collections is Interval ± Jitter×Interval (uniform), the first
	// collection and the first delivery of a queued backlog start after a
	// random [0, Jitter×Interval), retry backoff is randomized ("equal
	// jitter", see Backoff) and a server's Retry-After is stretched by a
	// random [0, Jitter) of itself. 0 (unset) and values >= 1 mean
	// DefaultJitter (0.1); NoJitter (any negative value) turns all of it off.
	Jitter float64
	// MaxSeries caps the series kept per cycle after the allowlist (0: no cap).
	MaxSeries int
	// MaxSamplesPerRequest sizes remote-write requests (default 2000).
	MaxSamplesPerRequest int
	MinBackoff           time.Duration // first retry wait (default 1s)
	MaxBackoff           time.Duration // cap of the exponential backoff (default 1m)
	// MaxRetryAfter caps how long a server's Retry-After is honoured (default 10m).
	MaxRetryAfter time.Duration
	// FlushTimeout bounds the last delivery attempt after Run's context ends (default 10s).
	FlushTimeout time.Duration
	// SeriesCacheSize caps the federated series whose policy decisions and
	// relabeled labels are remembered from one cycle to the next (default
	// 100000; negative: no cache). See seriesCache; each costs a few hundred
	// bytes of heap (BenchmarkCycle: ~0.6 KiB of RSS per series at 100k).
	SeriesCacheSize int

	sleep func(ctx context.Context, d time.Duration) error // tests
	// learnServerTimeout bounds Collect's wait for the authorizer's first
	// answer (learnServer; default defaultLearnServerTimeout).
	learnServerTimeout time.Duration
}

func (o *Options) defaults() {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Jitter == 0 || o.Jitter >= 1 { // negative: NoJitter, kept
		o.Jitter = DefaultJitter
	}
	if o.MaxSamplesPerRequest <= 0 {
		o.MaxSamplesPerRequest = 2000
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(time.Minute, o.MinBackoff)
	}
	if o.MaxRetryAfter <= 0 {
		o.MaxRetryAfter = 10 * time.Minute
	}
	if o.FlushTimeout <= 0 {
		o.FlushTimeout = 10 * time.Second
	}
	if o.SeriesCacheSize == 0 {
		o.SeriesCacheSize = defaultSeriesCacheSize
	}
	o.SeriesCacheSize = max(o.SeriesCacheSize, 0)
	if o.sleep == nil {
		o.sleep = Sleep
	}
	if o.learnServerTimeout <= 0 {
		o.learnServerTimeout = defaultLearnServerTimeout
	}
}

// defaultLearnServerTimeout bounds how long a collection waits for the
// authorizer's first answer: a few round trips, small against the
// 4m30s interval and the random wait before the first collection.
const defaultLearnServerTimeout = 10 * time.Second

const defaultSeriesCacheSize = 100_000

// Sleep waits d, or returns ctx's error as soon as ctx is done.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

type metrics struct {
	cycles        *prometheus.CounterVec
	cycleDuration prometheus.Histogram
	lastSuccess   prometheus.Gauge
	federated     prometheus.Counter
	federateBytes prometheus.Counter
	filtered      *prometheus.CounterVec
	queued        prometheus.Counter
	sent          prometheus.Counter
	dropped       *prometheus.CounterVec
	requests      *prometheus.CounterVec
	sendDuration  prometheus.Histogram
	retries       prometheus.Counter
	cachedSeries  prometheus.Gauge
	tc            telemeterClientMetrics
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		cycles: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_cycles_total", Help: "Collection cycles by result.",
		}, []string{"result"}),
		cycleDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "phonehome_forward_cycle_duration_seconds", Help: "Duration of a federate-filter-anonymize-queue cycle.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 8),
		}),
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_last_success_timestamp_seconds", Help: "Unix time of the last successful collection cycle.",
		}),
		federated: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_forward_federated_samples_total", Help: "Samples parsed from /federate (kept or not).",
		}),
		federateBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_forward_federate_bytes_total", Help: "Bytes of /federate response bodies read.",
		}),
		filtered: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_filtered_samples_total", Help: "Samples removed by policy, by reason (allowlist, relabel).",
		}, []string{"reason"}),
		queued: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_forward_queued_samples_total", Help: "Samples written to the on-disk queue.",
		}),
		sent: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_forward_sent_samples_total", Help: "Samples acknowledged by the receiver.",
		}),
		dropped: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_dropped_samples_total", Help: "Collected samples lost, by reason.",
		}, []string{"reason"}),
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_send_requests_total", Help: "Remote-write attempts by HTTP status code (\"error\" for transport failures).",
		}, []string{"code"}),
		sendDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "phonehome_forward_send_duration_seconds", Help: "Latency of remote-write attempts (in telemeter mode, the wait for a stock telemeter-server's upload window comes before, not in, it).",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 8),
		}),
		retries: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_forward_send_retries_total", Help: "Remote-write attempts that will be retried.",
		}),
		cachedSeries: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_cached_series", Help: "Federated series whose filtering and relabeling are remembered across cycles.",
		}),
		tc: newTelemeterClientMetrics(f),
	}
	for _, r := range []string{"success", "error"} {
		m.cycles.WithLabelValues(r)
	}
	for _, r := range []string{ReasonAllowlist, ReasonRelabel} {
		m.filtered.WithLabelValues(r)
	}
	for _, r := range []string{ReasonMaxSeries, ReasonSelectorCap, ReasonMaxBytes, ReasonQueueFull, ReasonRecordTooLarge, ReasonQueueError, ReasonHTTP4xx, ReasonInvalid, ReasonPartialWrite, ReasonSuperseded} {
		m.dropped.WithLabelValues(r)
	}
	return m
}

// Forwarder runs the collection and delivery loops. Create it with New.
type Forwarder struct {
	logger *slog.Logger
	m      *metrics
	src    Source
	policy atomic.Pointer[Policy]
	q      *Queue
	sender Sender
	opts   Options

	loggedCap sync.Map                  // reason -> struct{}: caps are logged once per process
	scratch   scratch                   // reused by Collect, which must not run concurrently
	last      atomic.Pointer[lastCycle] // for LastCycleHandler
	inflight  inflightRecord            // the record deliver is sending
}

// inflightRecord is the queue record being delivered. A full queue may
// evict it meanwhile; its samples are then counted once, when delivery
// ends: sent if the send succeeded after all, dropped if it did not.
type inflightRecord struct {
	mu      sync.Mutex
	pos     Position
	set     bool
	evicted bool
}

func (r *inflightRecord) start(pos Position) {
	r.mu.Lock()
	r.pos, r.set, r.evicted = pos, true, false
	r.mu.Unlock()
}

// evict reports whether pos is the record in flight, marking it evicted.
func (r *inflightRecord) evict(pos Position) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.set && r.pos == pos {
		r.evicted = true
		return true
	}
	return false
}

// end reports whether the record was evicted while in flight.
func (r *inflightRecord) end() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set = false
	return r.evicted
}

// scratch holds Collect's buffers across cycles.
type scratch struct {
	lb              *labels.Builder
	cache           *seriesCache
	miss            cachedSeries // a series evaluated afresh
	batch           []writev2.TimeSeries
	refs            []uint32
	samples         []writev2.Sample
	raw, compressed []byte
}

// New returns a Forwarder that collects from src, applies policy, queues in q
// and delivers with sender. Unless q was opened with its own OnDrop, New
// installs one that counts evicted samples as dropped{reason="queue_full"}.
// The Forwarder does not close the queue; it must be the queue's only user.
func New(logger *slog.Logger, reg prometheus.Registerer, src Source, policy Policy, q *Queue, sender Sender, opts Options) *Forwarder {
	opts.defaults()
	f := &Forwarder{logger: logger, m: newMetrics(reg), src: src, q: q, sender: sender, opts: opts}
	if policy.Allow != nil && policy.Rules != nil {
		f.policy.Store(&policy)
	}
	q.setOnDropIfUnset(f.countQueueDrop)
	return f
}

// Policy returns the policy in force; false if none is yet (ErrNoPolicy).
func (f *Forwarder) Policy() (Policy, bool) {
	p := f.policy.Load()
	if p == nil {
		return Policy{}, false
	}
	return *p, true
}

// SetPolicy atomically replaces the policy; the next cycle uses it whole
// (a cycle in progress keeps the one it started with). Both Allow and Rules
// must be set.
func (f *Forwarder) SetPolicy(p Policy) error {
	if p.Allow == nil || p.Rules == nil {
		return errors.New("policy needs an allowlist and relabel rules")
	}
	f.policy.Store(&p)
	return nil
}

// countQueueDrop records the samples of a queue record evicted to make
// room; the record being delivered is counted when its delivery ends.
func (f *Forwarder) countQueueDrop(payload []byte, pos Position) {
	if f.inflight.evict(pos) {
		return
	}
	r, err := decodePayload(payload)
	if err != nil {
		f.q.countInvalid(pos, err) // the queue is locked: OnDrop's contract
		return
	}
	f.countEvicted(r.Samples)
}

func (f *Forwarder) countEvicted(samples int) {
	f.m.dropped.WithLabelValues(ReasonQueueFull).Add(float64(samples))
	f.logCapOnce(ReasonQueueFull, "queue full, dropping oldest data")
}

func (f *Forwarder) logCapOnce(reason, msg string) {
	if _, loaded := f.loggedCap.LoadOrStore(reason, struct{}{}); !loaded {
		f.logger.Warn(msg, "reason", reason)
	}
}

// Run collects every Interval and delivers the queue until ctx ends; then it
// makes one bounded (FlushTimeout) attempt to deliver what is queued and
// returns nil. Whatever is still queued stays on disk for the next start.
func (f *Forwarder) Run(ctx context.Context) error {
	sendCtx, cancelSend := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSend()
	draining := make(chan struct{})
	done := make(chan struct{})
	j := f.jitter()
	// Forwarders that start together (after an outage, in a rollout) neither
	// collect nor deliver their backlog in the same second: both wait a
	// random part of the interval first.
	start := upTo(f.opts.Interval, j)
	go func() {
		defer close(done)
		t := time.NewTimer(start)
		select {
		case <-t.C:
		case <-draining: // stopping: deliver what is queued at once
		case <-sendCtx.Done():
		}
		t.Stop()
		f.sendLoop(sendCtx, draining)
	}()

	f.logger.Info("collecting", "interval", f.opts.Interval.String(), "jitter", j, "first_in", start.String())
	for delay := start; ; delay = spread(f.opts.Interval, j) {
		if err := f.opts.sleep(ctx, delay); err != nil {
			break
		}
		if err := f.Collect(ctx); err != nil && ctx.Err() == nil {
			f.logger.Warn("collection failed", "err", err)
		}
	}

	f.logger.Info("stopping: delivering what is queued", "flush_timeout", f.opts.FlushTimeout.String())
	close(draining)
	t := time.AfterFunc(f.opts.FlushTimeout, cancelSend)
	<-done
	t.Stop()
	if n, _ := f.q.Len(); n > 0 {
		f.logger.Info("stopping with queued data, it is delivered after restart", "records", n)
	}
	return nil
}

// Collect runs one federate-filter-anonymize-encode cycle and appends the
// resulting requests to the queue with a single fsync. Calls must not overlap
// (Run calls it sequentially).
func (f *Forwarder) Collect(ctx context.Context) (err error) {
	f.learnServer(ctx)
	start := time.Now()
	defer func() {
		f.m.cycleDuration.Observe(time.Since(start).Seconds())
		f.m.tc.request(requestFederate, err != nil)
		if err != nil {
			f.m.cycles.WithLabelValues("error").Inc()
			return
		}
		f.m.cycles.WithLabelValues("success").Inc()
		f.m.lastSuccess.SetToCurrentTime()
	}()

	pol := f.policy.Load()
	if pol == nil {
		return ErrNoPolicy
	}
	sc := &f.scratch
	if sc.lb == nil {
		sc.lb = labels.NewBuilder(labels.EmptyLabels())
		sc.cache = newSeriesCache(f.opts.SeriesCacheSize)
		sc.batch = make([]writev2.TimeSeries, 0, f.opts.MaxSamplesPerRequest)
		sc.samples = make([]writev2.Sample, 0, f.opts.MaxSamplesPerRequest)
		sc.refs = make([]uint32, 0, 32*f.opts.MaxSamplesPerRequest)
	}
	cache := sc.cache
	cache.begin(pol)
	perRequest := f.opts.MaxSamplesPerRequest
	if f.snapshots() {
		perRequest = math.MaxInt // one upload per cycle (arrivalStamper)
	}
	var (
		batch               = sc.batch[:0]
		records             [][]byte
		recordSamples       []int
		kept, federated     int
		allowOut, relabOut  int
		overSeries, invalid int
		overCap             int
		capCounts           = make([]int, len(pol.Caps))
		// Per-batch arenas: one allocation for all label references and
		// samples of a request instead of two per series; reset after each flush.
		refArena    = sc.refs[:0]
		sampleArena = sc.samples[:0]
		syms        = cache.syms
		meta        metaSymbols
	)
	syms.startRequest()
	defer func() { sc.refs = refArena[:0]; syms.startRequest() }()
	// Requests are built and queued in the remote-write 2.0 form (see Record).
	flush := func() {
		if len(batch) == 0 {
			return
		}
		req := writev2.Request{Symbols: syms.reqSyms, Timeseries: batch}
		raw, err := req.OptimizedMarshal(sc.raw[:0])
		if err != nil {
			invalid += len(batch)
			f.logger.Error("encode write request", "err", err)
		} else {
			sc.raw = raw
			if n := snappy.MaxEncodedLen(len(raw)); cap(sc.compressed) < n {
				sc.compressed = make([]byte, n)
			}
			records = append(records, encodePayloadV2(len(batch), snappy.Encode(sc.compressed[:cap(sc.compressed)], raw)))
			recordSamples = append(recordSamples, len(batch))
		}
		clear(batch)
		batch = batch[:0]
		refArena = refArena[:0]
		sampleArena = sampleArena[:0]
		syms.startRequest()
	}
	add := func(s *Sample) error {
		federated++
		var (
			e *cachedSeries
			k seriesKey
		)
		cacheable := s.key != nil && cache.max > 0
		if cacheable {
			k = cache.key(s.key)
			e = cache.get(k)
		}
		if e == nil {
			s.loadLabels()
			e = &sc.miss
			evaluate(pol, sc.lb, syms, s.Labels, e)
			if cacheable {
				if c := cache.put(k, e, s.Labels.Get(model.MetricNameLabel)); c != nil {
					e = c
				}
			}
		}
		if e.drop == ReasonAllowlist {
			allowOut++
			return nil
		}
		if f.opts.MaxSeries > 0 && kept >= f.opts.MaxSeries {
			overSeries++
			return nil
		}
		for _, i := range e.caps {
			if capCounts[i] >= pol.Caps[i].Max {
				overCap++
				return nil
			}
		}
		if e.drop == ReasonRelabel {
			relabOut++
			return nil
		}
		for _, i := range e.caps {
			capCounts[i]++
		}
		kept++
		if len(refArena)+len(e.refs) > cap(refArena) {
			// Earlier series of this batch keep the old backing array.
			refArena = make([]uint32, 0, max(2*cap(refArena), 64*len(e.refs)))
		}
		start := len(refArena)
		for _, id := range e.refs {
			refArena = append(refArena, syms.ref(id))
		}
		ts := writev2.TimeSeries{
			LabelsRefs: refArena[start:len(refArena):len(refArena)],
			Metadata:   meta.of(syms, pol.Rules, s.metaFor(e.name)),
		}
		switch {
		case s.H != nil:
			ts.Histograms = []writev2.Histogram{writev2.FromIntHistogram(0, s.T, s.H)}
		case s.FH != nil:
			ts.Histograms = []writev2.Histogram{writev2.FromFloatHistogram(0, s.T, s.FH)}
		default:
			if len(sampleArena) == cap(sampleArena) {
				sampleArena = make([]writev2.Sample, 0, max(64, 2*cap(sampleArena)))
			}
			sampleArena = append(sampleArena, writev2.Sample{Value: s.V, Timestamp: s.T})
			ts.Samples = sampleArena[len(sampleArena)-1 : len(sampleArena) : len(sampleArena)]
		}
		batch = append(batch, ts)
		if len(batch) >= perRequest {
			flush()
		}
		return nil
	}
	var (
		st   FetchStats
		ferr error
	)
	switch src := f.src.(type) {
	case lazySource:
		st, ferr = src.fetchLazy(ctx, pol.Allow.Selectors(), add)
	case MatchingSource:
		st, ferr = src.FetchMatching(ctx, pol.Allow.Selectors(), add)
	default:
		st, ferr = f.src.Fetch(ctx, add)
	}
	cache.end(ferr == nil && ctx.Err() == nil)
	f.m.cachedSeries.Set(float64(len(cache.entries)))
	if pol.DefinitionVersion != "" && ctx.Err() == nil {
		f.addInfo(pol, syms, &batch)
	}
	flush()

	f.m.federated.Add(float64(federated + st.OverBytes))
	if ferr == nil {
		f.m.tc.federation(federated+st.OverBytes, kept)
	}
	f.m.federateBytes.Add(float64(st.Bytes))
	f.m.filtered.WithLabelValues(ReasonAllowlist).Add(float64(allowOut))
	f.m.filtered.WithLabelValues(ReasonRelabel).Add(float64(relabOut))
	f.m.dropped.WithLabelValues(ReasonInvalid).Add(float64(invalid))
	if overSeries > 0 {
		f.m.dropped.WithLabelValues(ReasonMaxSeries).Add(float64(overSeries))
		f.logCapOnce(ReasonMaxSeries, "series cap reached, dropping the rest of the cycle")
	}
	if overCap > 0 {
		f.m.dropped.WithLabelValues(ReasonSelectorCap).Add(float64(overCap))
		f.logCapOnce(ReasonSelectorCap, "a gathering definition's per-selector cap was reached, dropping the rest of its series")
	}
	if st.OverBytes > 0 {
		f.m.dropped.WithLabelValues(ReasonMaxBytes).Add(float64(st.OverBytes))
		f.logCapOnce(ReasonMaxBytes, "federate byte cap reached, dropping the rest of the response")
	}

	if ferr == nil || len(records) > 0 { // a failed fetch still queues what it read
		f.last.Store(&lastCycle{records: records, at: start})
	}
	qerr := f.enqueue(records, recordSamples)
	f.logger.Debug("collected", "federated", federated, "kept", kept, "requests", len(records), "bytes", st.Bytes)
	return errors.Join(ferr, qerr)
}

// addInfo appends gathering.InfoMetric{version=...} 1 at the current time,
// relabeled like every series (so it carries _id and the external labels).
// It passes neither the allowlist nor the caps: it describes the forwarder.
func (f *Forwarder) addInfo(pol *Policy, syms *symbols, batch *[]writev2.TimeSeries) {
	lb := labels.NewBuilder(labels.FromStrings(model.MetricNameLabel, gathering.InfoMetric, "version", pol.DefinitionVersion))
	if !pol.Rules.Apply(lb) {
		return
	}
	refs := syms.internLabels(lb.Labels(), nil)
	for i, id := range refs {
		refs[i] = syms.ref(id)
	}
	*batch = append(*batch, writev2.TimeSeries{
		LabelsRefs: refs,
		Samples:    []writev2.Sample{{Value: 1, Timestamp: time.Now().UnixMilli()}},
		Metadata:   writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGE},
	})
}

// evaluate decides what pol makes of a federated series with labels ls and
// stores it in e (see cachedSeries), reusing e's slices; lb is scratch.
func evaluate(pol *Policy, lb *labels.Builder, syms *symbols, ls labels.Labels, e *cachedSeries) {
	*e = cachedSeries{caps: e.caps[:0], refs: e.refs[:0]}
	if !pol.Allow.Allows(ls) {
		e.drop = ReasonAllowlist
		return
	}
	for i, c := range pol.Caps {
		if c.Allow.Allows(ls) {
			e.caps = append(e.caps, i)
		}
	}
	lb.Reset(ls)
	if !pol.Rules.Apply(lb) {
		e.drop = ReasonRelabel
		return
	}
	e.refs = syms.internLabels(lb.Labels(), e.refs)
}

// metaSymbols converts a family's metadata to its remote-write 2.0 form,
// remembering the last one: consecutive series share their family's.
type metaSymbols struct {
	last       metadata.Metadata
	ok         bool
	typ        writev2.Metadata_MetricType
	help, unit uint32 // interned
}

// of returns m with its help and unit (the raw id scrubbed) as references of
// the current request; the zero Metadata if there is nothing to say. Help
// text is left out while rules anonymize labels: a family's help may quote a
// value that one of its series carries hashed, and which values those are
// is known only once the family's last series (the response's last) is
// read, after its first ones were sent. (Prometheus' own /federate sends no
// help text anyway.)
func (ms *metaSymbols) of(syms *symbols, rules *relabel.Rules, m metadata.Metadata) writev2.Metadata {
	if !ms.ok || m != ms.last {
		ms.last, ms.ok = m, true
		ms.typ = writev2.FromMetadataType(m.Type)
		ms.help = 0
		if !rules.AnonymizesLabels() {
			ms.help = syms.intern(rules.ScrubText(m.Help))
		}
		ms.unit = syms.intern(rules.ScrubText(m.Unit))
	}
	if ms.typ == writev2.Metadata_METRIC_TYPE_UNSPECIFIED && ms.help == 0 && ms.unit == 0 {
		return writev2.Metadata{}
	}
	return writev2.Metadata{Type: ms.typ, HelpRef: syms.ref(ms.help), UnitRef: syms.ref(ms.unit)}
}

func (f *Forwarder) enqueue(records [][]byte, samples []int) error {
	if len(records) == 0 {
		return nil
	}
	total := 0
	for _, n := range samples {
		total += n
	}
	err := f.q.Append(records...)
	if err == nil {
		f.m.queued.Add(float64(total))
		return nil
	}
	if !errors.Is(err, ErrRecordTooLarge) {
		queued := 0 // the records queued before the error will be delivered
		for _, n := range samples[:appended(err, len(records))] {
			queued += n
		}
		f.m.queued.Add(float64(queued))
		f.m.dropped.WithLabelValues(ReasonQueueError).Add(float64(total - queued))
		return fmt.Errorf("queue %d samples: %w", total-queued, err)
	}
	// The cycle as a whole does not fit: store what fits, record by record.
	for i, r := range records {
		if err := f.q.Append(r); err != nil && appended(err, 1) == 0 {
			reason := ReasonQueueError
			if errors.Is(err, ErrRecordTooLarge) {
				reason = ReasonRecordTooLarge
			}
			f.m.dropped.WithLabelValues(reason).Add(float64(samples[i]))
			f.logCapOnce(reason, "request does not fit the queue, dropping it")
			continue
		}
		f.m.queued.Add(float64(samples[i]))
	}
	return nil
}

// sendLoop delivers queued records oldest first until ctx ends, or until the
// queue is empty once draining is closed.
func (f *Forwarder) sendLoop(ctx context.Context, draining <-chan struct{}) {
	failures := 0
	for ctx.Err() == nil {
		p, pos, t, ok, err := f.q.Peek()
		if errors.Is(err, ErrQueueClosed) {
			return
		}
		if err != nil {
			// Dropping an unreadable record, the queue could not write its
			// cursor (a full disk): try again rather than stop delivering
			// for good while the process looks healthy.
			d := f.backoff(failures)
			f.logger.Error("read queue, retrying", "err", err, "retry_in", d.String())
			failures++
			if f.opts.sleep(ctx, d) != nil {
				return
			}
			continue
		}
		failures = 0
		if !ok {
			select {
			case <-f.q.Notify():
				continue
			case <-draining:
				// Appends may have raced with the close of draining.
				if _, _, _, ok, _ := f.q.Peek(); ok {
					continue
				}
				return
			case <-ctx.Done():
				return
			}
		}
		f.deliver(ctx, p, pos, t)
	}
}

// deliver sends one queued record, queued at t, retrying until it is
// accepted, rejected, evicted from the queue, superseded (snapshots), or ctx
// ends (then it stays queued).
func (f *Forwarder) deliver(ctx context.Context, payload []byte, pos Position, t time.Time) {
	rec, err := decodePayload(payload)
	if err != nil {
		if err := f.q.dropInvalid(pos, err); err != nil { // its samples are unknown
			f.logger.Error("acknowledge queue record", "err", err)
		}
		return
	}
	n := rec.Samples
	f.inflight.start(pos)
	counted := false // as sent or dropped
	defer func() {
		if f.inflight.end() && !counted { // evicted, and never delivered
			f.countEvicted(n)
		}
	}()
	if !f.q.Pending(pos) { // evicted since Peek, and counted then: not sent
		return
	}
	for attempt := 0; ; attempt++ {
		if f.waitForWindow(ctx) != nil {
			return // stopping: it stays queued
		}
		if !f.q.Pending(pos) { // evicted from a full queue while we waited
			return
		}
		if f.superseded(t) {
			f.dropSuperseded(pos, n)
			counted = true
			return
		}
		start := time.Now()
		w, err := f.send(ctx, rec)
		f.m.sendDuration.Observe(time.Since(start).Seconds())
		f.m.requests.WithLabelValues(codeOf(err)).Inc()
		f.m.tc.request(requestSend, err != nil && ctx.Err() == nil) // not a failure: stopped at shutdown
		if err == nil {
			sent := n
			if w.Known && w.Samples+w.Histograms < n {
				// A 2xx must mean everything was written (2.0 spec); count
				// what the receiver says it did not write.
				sent = w.Samples + w.Histograms
				f.m.dropped.WithLabelValues(ReasonPartialWrite).Add(float64(n - sent))
				f.logger.Warn("receiver acknowledged fewer samples than sent", "sent", n, "written", sent)
			}
			f.m.sent.Add(float64(sent))
			counted = true
			f.ack(pos)
			if attempt > 0 {
				f.logger.Info("remote write recovered", "attempts", attempt+1)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		var re RetryableError
		if !errors.As(err, &re) {
			reason := ReasonHTTP4xx
			var he *HTTPError
			if !errors.As(err, &he) {
				reason = ReasonInvalid
			}
			// A 4xx may come after the valid part of the request was
			// stored (2.0 responses say how much): that part was sent.
			written := 0
			if w.Known {
				written = min(w.Samples+w.Histograms, n)
			}
			f.m.sent.Add(float64(written))
			f.m.dropped.WithLabelValues(reason).Add(float64(n - written))
			counted = true
			f.logger.Warn("remote write rejected, dropping request", "samples", n, "written", written, "err", err)
			f.ack(pos)
			return
		}
		f.m.retries.Inc()
		d := f.backoff(attempt)
		if re.RetryAfter > 0 {
			// Every forwarder refused at once is told the same Retry-After.
			d = stretch(min(re.RetryAfter, f.opts.MaxRetryAfter), f.jitter())
		}
		if attempt == 0 {
			f.logger.Warn("remote write failed, retrying", "err", err, "retry_in", d.String())
		} else {
			f.logger.Debug("remote write failed, retrying", "err", err, "attempt", attempt+1, "retry_in", d.String())
		}
		if f.opts.sleep(ctx, d) != nil {
			return
		}
		if !f.q.Pending(pos) { // evicted from a full queue while we waited
			return
		}
	}
}

func (f *Forwarder) send(ctx context.Context, rec Record) (Written, error) {
	if rs, ok := f.sender.(RecordSender); ok {
		return rs.SendRecord(ctx, rec)
	}
	req, err := rec.toV1()
	if err != nil {
		return Written{}, err
	}
	return Written{}, f.sender.Send(ctx, req)
}

func (f *Forwarder) ack(pos Position) {
	if err := f.q.Ack(pos); err != nil {
		f.logger.Error("acknowledge queue record", "err", err)
	}
}

// backoff is capped exponential with "equal jitter": half fixed, half
// random; with NoJitter, the full capped exponential.
func (f *Forwarder) backoff(attempt int) time.Duration {
	if f.opts.Jitter < 0 {
		return cappedExp(attempt, f.opts.MinBackoff, f.opts.MaxBackoff)
	}
	return Backoff(attempt, f.opts.MinBackoff, f.opts.MaxBackoff)
}

// jitter is the fraction in force: 0 with NoJitter.
func (f *Forwarder) jitter() float64 { return max(f.opts.Jitter, 0) }

func codeOf(err error) string {
	if err == nil {
		return "2xx"
	}
	var he *HTTPError
	if errors.As(err, &he) {
		return fmt.Sprint(he.Code)
	}
	return "error"
}

// DefinitionPolicy builds the policy of a gathering definition: its
// selectors replace the local ones, its anonymize_labels are added to the
// local relabel configuration base, and its caps and version come along.
func DefinitionPolicy(base relabel.Config, c *gathering.Compiled) (Policy, error) {
	base.AnonymizeLabels = append(slices.Clip(base.AnonymizeLabels), c.Def.AnonymizeLabels...)
	rules, err := relabel.Parse(base)
	if err != nil {
		return Policy{}, fmt.Errorf("definition %s: %w", c.Def.Version, err)
	}
	return Policy{Allow: c.Allow, Rules: rules, Caps: c.Caps, DefinitionVersion: c.Def.Version}, nil
}
