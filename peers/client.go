package peers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/storage/remote"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/phonehome/phonehome/query"
)

// peer is one other replica.
type peer struct {
	addr    string
	self    atomic.Bool
	chunked remote.ReadClient // streamed XOR chunks: Selects with samples
	sampled remote.ReadClient // sampled: series-only Selects (streaming drops series without chunks)
	query   *http.Client      // pushdown.Path, metadata, label and series calls

	fallback map[string]*atomic.Bool // by call (callLabels, callSeries): read from its series (indexCallDone)
	down     reachability            // marked when a call cannot connect (reachability.go)
	checking atomic.Bool             // a hang check of the peer is running (checkHung)

	mu      sync.Mutex
	horizon map[string]observation // by tenant
}

// observation is a horizon a peer reported, and when it arrived.
type observation struct {
	horizon int64
	at      time.Time
}

func (s *Set) newPeer(addr string) (*peer, error) {
	u, err := url.Parse(s.cfg.Scheme + "://" + addr + "/api/v1/read")
	if err != nil {
		return nil, err
	}
	p := &peer{addr: addr, horizon: map[string]observation{}, fallback: map[string]*atomic.Bool{callLabels: {}, callSeries: {}}}
	p.query = &http.Client{Transport: &transport{set: s, peer: p}, CheckRedirect: noRedirects}
	client := func(types ...prompb.ReadRequest_ResponseType) (remote.ReadClient, error) {
		rc, err := remote.NewReadClient("peer", &remote.ClientConfig{
			URL:                   &config_util.URL{URL: u},
			Timeout:               s.cfg.Timeout,
			HTTPClientConfig:      config_util.DefaultHTTPClientConfig,
			ChunkedReadLimit:      50 << 20,
			AcceptedResponseTypes: types,
		})
		if err != nil {
			return nil, err
		}
		c, ok := rc.(*remote.Client)
		if !ok {
			return nil, fmt.Errorf("unexpected read client %T", rc)
		}
		// Our transport (client TLS, peer headers), not the one built
		// from the HTTP client config.
		c.Client = &http.Client{Transport: &transport{set: s, peer: p}, CheckRedirect: noRedirects}
		return c, nil
	}
	if p.chunked, err = client(prompb.ReadRequest_STREAMED_XOR_CHUNKS, prompb.ReadRequest_SAMPLES); err != nil {
		return nil, err
	}
	if p.sampled, err = client(prompb.ReadRequest_SAMPLES); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *peer) observe(tenant string, h int64, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.horizon[tenant] = observation{horizon: h, at: at}
}

// covered reports whether the peer can be skipped for a query of tenant
// ending at maxt: it reported, less than ttl ago, a horizon after maxt, and
// the bucket view has synced since (so the blocks it uploaded before
// reporting are visible).
func (p *peer) covered(tenant string, maxt int64, now time.Time, ttl time.Duration, synced func(time.Time) bool) bool {
	if synced == nil {
		return false
	}
	p.mu.Lock()
	o, ok := p.horizon[tenant]
	p.mu.Unlock()
	return ok && maxt < o.horizon && now.Sub(o.at) < ttl && synced(o.at)
}

// recogniseSelf reports whether resp is this receiver's own answer (its
// InstanceHeader), and the first time marks p as this receiver: left out
// of the peers from then on, and of their count.
func (s *Set) recogniseSelf(p *peer, resp *http.Response) bool {
	if resp.Header.Get(InstanceHeader) != s.instance {
		return false
	}
	if !p.self.Swap(true) {
		s.logger.Info("peer is this receiver, not reading from it", "peer", p.addr)
		s.mu.Lock()
		s.countLocked()
		s.mu.Unlock()
	}
	return true
}

// missing is the warning of a read that the peer at addr failed with err,
// or could not be asked (departed.go): the answer lacks that peer's data.
// docs/scale-out.md quotes it.
func missing(addr string, err error) error {
	return fmt.Errorf("peer %s unavailable, its data is missing: %w", addr, err)
}

type tenantKey struct{}

// transport adds the peer protocol's headers and credential for the tenant
// of the request's context, and records what the peer reports.
type transport struct {
	set  *Set
	peer *peer
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	tenant, _ := req.Context().Value(tenantKey{}).(string)
	req = req.Clone(req.Context())
	req.Header.Set(ScopeHeader, ScopeLocal)
	if tok, replica := t.set.credential(tenant); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
		if replica {
			req.Header.Set(TenantHeader, tenant)
		}
	}
	start := t.set.now()
	resp, err := t.set.roundTrip(t.peer, req)
	if err != nil {
		return nil, err
	}
	t.set.m.duration.Observe(time.Since(start).Seconds())
	t.set.recogniseSelf(t.peer, resp)
	if resp.StatusCode/100 == 2 {
		if h, err := strconv.ParseInt(resp.Header.Get(HorizonHeader), 10, 64); err == nil {
			t.peer.observe(tenant, h, t.set.now())
		}
	}
	return resp, nil
}

// Reader answers queries over an inner reader (this receiver's local data
// and the bucket) and every peer's local data. It implements query.Reader.
type Reader struct {
	set   *Set
	inner interface {
		Querier(tenant string, mint, maxt int64) (promstorage.Querier, error)
	}
}

// NewReader returns the fleet reader.
func (s *Set) NewReader(inner interface {
	Querier(tenant string, mint, maxt int64) (promstorage.Querier, error)
},
) *Reader {
	return &Reader{set: s, inner: inner}
}

// Querier merges the inner querier (primary: its errors fail the query)
// with one querier per peer not covered by the bucket (secondaries: their
// errors are warnings), and one that fails with a warning per peer that
// left the peers before the bucket view synced (departed.go).
func (r *Reader) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	iq, err := r.inner.Querier(tenant, mint, maxt)
	if err != nil {
		return nil, err
	}
	var (
		pqs []*peerQuerier
		qs  []promstorage.Querier
	)
	now := r.set.now()
	for _, p := range r.set.snapshot() {
		if p.covered(tenant, maxt, now, time.Duration(r.set.cfg.HorizonTTL), r.set.synced) {
			r.set.m.reads.WithLabelValues("skipped").Inc()
			continue
		}
		pq := &peerQuerier{set: r.set, peer: p, tenant: tenant, mint: mint, maxt: maxt}
		pqs, qs = append(pqs, pq), append(qs, pq)
	}
	gone := r.set.departures()
	var goneErrs []error
	for _, d := range gone {
		qs = append(qs, departedQuerier{d: d})
		goneErrs = append(goneErrs, d.err())
	}
	// Under a limit, index calls keep the smallest values and series
	// everywhere (the peers do, IndexHandler), so the merge is the first
	// of the fleet's, whichever peers are read.
	if len(qs) == 0 {
		return query.LimitSmallest(iq), nil
	}
	merge := promstorage.NewMergeQuerier([]promstorage.Querier{iq}, qs, promstorage.ChainedSeriesMerge)
	return query.LimitSmallest(fleetQuerier{Querier: merge, inner: iq, peers: pqs, departed: goneErrs}), nil
}

// peerQuerier reads one tenant's local data of one peer.
type peerQuerier struct {
	set        *Set
	peer       *peer
	tenant     string
	mint, maxt int64
}

// Select reads the peer's series over remote read; series only (hints.Func
// "series", the series API) are asked of its index (seriesCall). The call
// starts at once and the set waits for its answer (pendingSet): PromQL and
// the series API ask for every selector (every match[] set) before they
// iterate any, so the peer is asked for all of them together rather than
// one after another, and a query takes the slowest call, not their sum.
func (q *peerQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	if hints != nil {
		// The caller's to change once Select returns: PromQL sorts
		// Grouping while the call encodes it.
		h := *hints
		h.Grouping = slices.Clone(hints.Grouping)
		hints = &h
	}
	ms = slices.Clone(ms)
	ch := make(chan promstorage.SeriesSet, 1)
	go func() {
		if hints != nil && hints.Func == "series" {
			ch <- q.seriesCall(ctx, sortSeries, hints, ms)
			return
		}
		ch <- q.read(ctx, sortSeries, hints, ms)
	}()
	return &pendingSet{ch: ch}
}

// pendingSet is a series set whose call is under way: its first use waits
// for the answer. The call ends by itself (the peer's timeout, or ctx).
type pendingSet struct {
	ch  <-chan promstorage.SeriesSet
	set promstorage.SeriesSet
}

func (p *pendingSet) answer() promstorage.SeriesSet {
	if p.set == nil {
		p.set = <-p.ch
	}
	return p.set
}

func (p *pendingSet) Next() bool                        { return p.answer().Next() }
func (p *pendingSet) At() promstorage.Series            { return p.answer().At() }
func (p *pendingSet) Err() error                        { return p.answer().Err() }
func (p *pendingSet) Warnings() annotations.Annotations { return p.answer().Warnings() }

// read reads the peer's series of ms over remote read.
func (q *peerQuerier) read(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms []*labels.Matcher) promstorage.SeriesSet {
	ctx = context.WithValue(ctx, tenantKey{}, q.tenant)
	src := q.peer.chunked
	if hints != nil && hints.Func == "series" {
		src = q.peer.sampled
	}
	// The read client directly, not remote's Querier: that one wraps every
	// series in a filter whose Labels rebuilds them on every call.
	query, err := remote.ToQuery(q.mint, q.maxt, ms, hints)
	if err != nil {
		return promstorage.ErrSeriesSet(err)
	}
	ss, err := src.Read(ctx, query, sortSeries)
	if err != nil {
		return &peerSeriesSet{SeriesSet: promstorage.ErrSeriesSet(fmt.Errorf("remote_read: %w", err)), q: q}
	}
	return &peerSeriesSet{SeriesSet: ss, q: q}
}

// eachSeries calls f with the labels of every series of the peer matching
// ms: label calls to a peer without a label endpoint (labels.go), over
// remote read.
func (q *peerQuerier) eachSeries(ctx context.Context, ms []*labels.Matcher, f func(labels.Labels)) (annotations.Annotations, error) {
	if len(ms) == 0 {
		ms = []*labels.Matcher{labels.MustNewMatcher(labels.MatchRegexp, model.MetricNameLabel, ".+")}
	}
	ss := q.read(ctx, false, &promstorage.SelectHints{Start: q.mint, End: q.maxt, Func: "series"}, ms)
	for ss.Next() {
		f(ss.At().Labels())
	}
	return ss.Warnings(), ss.Err()
}

func sortedLimited(set map[string]struct{}, hints *promstorage.LabelHints) []string {
	out := make([]string, 0, len(set))
	for v := range set {
		out = append(out, v)
	}
	slices.Sort(out)
	if hints != nil && hints.Limit > 0 && len(out) > hints.Limit {
		out = out[:hints.Limit]
	}
	return out
}

func (*peerQuerier) Close() error { return nil }

// peerSeriesSet counts the read and names the peer in its error. An error
// after the first series (the peer died mid-stream) becomes a warning too:
// the secondary merge only turns errors of the first Next into warnings.
type peerSeriesSet struct {
	promstorage.SeriesSet
	q       *peerQuerier
	started bool
	err     error
	done    bool

	// Streamed series build their labels on every Labels call, each time
	// with a new symbol table under -tags dedupelabels; the merge calls it
	// many times per series. Labels are built once, into one table.
	builder labels.ScratchBuilder
	symbols *labels.SymbolTable
}

// protoSeries is a remote-read series that decodes its labels on demand.
type protoSeries interface {
	ToLabels(b *labels.ScratchBuilder, _ []string) labels.Labels
}

func (s *peerSeriesSet) At() promstorage.Series {
	series := s.SeriesSet.At()
	ps, ok := series.(protoSeries)
	if !ok {
		return series
	}
	if s.symbols == nil {
		s.symbols = labels.NewSymbolTable()
		s.builder = labels.NewScratchBuilderWithSymbolTable(s.symbols, 0)
	}
	return labeledSeries{Series: series, lset: ps.ToLabels(&s.builder, nil)}
}

// labeledSeries is a series with its labels decoded once.
type labeledSeries struct {
	promstorage.Series
	lset labels.Labels
}

func (s labeledSeries) Labels() labels.Labels { return s.lset }

func (s *peerSeriesSet) Next() bool {
	if s.done {
		return false
	}
	if s.SeriesSet.Next() {
		s.started = true
		return true
	}
	s.done = true
	if err := s.SeriesSet.Err(); err != nil && !errors.Is(err, context.Canceled) {
		s.q.set.m.reads.WithLabelValues("error").Inc()
		s.q.set.logger.Debug("peer read failed", "peer", s.q.peer.addr, "err", err)
		s.err = missing(s.q.peer.addr, err)
	} else {
		s.q.set.m.reads.WithLabelValues("success").Inc()
	}
	return false
}

func (s *peerSeriesSet) Err() error {
	if s.started {
		return nil // reported as a warning instead
	}
	return s.err
}

func (s *peerSeriesSet) Warnings() annotations.Annotations {
	ws := s.SeriesSet.Warnings()
	if s.started && s.err != nil {
		ws = ws.Add(s.err)
	}
	return ws
}

// noRedirects answers a redirect as it is: a peer never redirects, a POST
// followed as a GET would lose its form (match[], start, end, limit), and
// the transport would carry the replica credential to another host.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
