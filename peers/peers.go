// Package peers makes every receiver replica answer for the whole fleet.
//
// Each replica serves its local data (head and local blocks) over the
// Prometheus remote-read protocol. A replica configured with its peers reads
// their local data for every query and merges it with its own and the
// bucket's, deduplicating as the bucket merge does: series equal in their
// labels are one series with the union of their samples, one per timestamp
// (promstorage.ChainedSeriesMerge). A peer that fails is a warning in the
// response, never a failed query (Prometheus' partial response for remote
// storage), and is counted. Metric metadata, which blocks do not carry, is
// read from each peer's own and merged too (Metadata, MetadataHandler), and
// label names and values and the series API's series are asked of each
// peer's index rather than read from its series (IndexHandler). Peers are
// asked in parallel, and a query's selectors together (peerQuerier.Select),
// as are a label call's match[] sets (query asks for them all at the
// first), so a query takes as long as the slowest call, not their sum.
//
// A peer reports, with each answer, its horizon: the time before which all
// it holds and can still accept is in the bucket. Queries that end before it
// skip that peer, once this replica's bucket view has synced since.
//
// Peers authenticate to each other either with a read token per tenant or
// with a replica token that reads only local data; see Config.
package peers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Header names of the peer protocol, on top of remote read.
const (
	// ScopeHeader: "local" asks a receiver for its local data only (head
	// and local blocks), not its fleet view, so that peers never recurse.
	ScopeHeader = "X-Phonehome-Read-Scope"
	// TenantHeader names the tenant of a replica-token request. It is
	// ignored with any other credential.
	TenantHeader = "X-Phonehome-Tenant"
	// HorizonHeader (response) is the tenant's horizon in milliseconds.
	HorizonHeader = "X-Phonehome-Horizon"
	// InstanceHeader (response) is the answering process' random id.
	InstanceHeader = "X-Phonehome-Instance"
)

// ScopeLocal is the value of ScopeHeader for local reads.
const ScopeLocal = "local"

// Options are the optional dependencies of a Set.
type Options struct {
	// HTTPClient, when set, is the transport to peers (for example
	// tls_config's, webtls.ClientConfig.NewRoundTripper); its Transport is
	// wrapped with the peer headers and its Timeout left as is
	// (Config.Timeout bounds each read). Nil: a clone of
	// http.DefaultTransport.
	HTTPClient *http.Client
	// Resolver resolves dns+ and dnssrv+ endpoints; nil is net.DefaultResolver.
	Resolver Resolver
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// BucketSynced reports whether this receiver's bucket view has
	// completed a sync that started after the given time. Nil (no bucket
	// store) never skips a peer whose horizon the bucket covers, and
	// warns of no peer that left (departed.go).
	BucketSynced func(time.Time) bool
}

// Resolver is the part of *net.Resolver discovery uses.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// Set is the receiver's view of its peers: discovery, credentials, the
// remote-read clients and what each peer reported. Its methods are safe for
// concurrent use. Run refreshes it until its context ends.
type Set struct {
	logger    *slog.Logger
	cfg       Config
	instance  string
	base      http.RoundTripper
	resolver  Resolver
	now       func() time.Time
	m         *metrics
	endpoints []endpoint
	// probeEvery is how often unreachable peers are probed (probeInterval).
	probeEvery time.Duration

	synced func(time.Time) bool // Options.BucketSynced

	tokensMu     sync.Mutex               // serializes loadTokens (Refresh, ReloadTokens)
	replicaToken atomic.Pointer[[]string] // sent: the first; accepted: all
	tenantTokens atomic.Pointer[map[string]string]

	mu       sync.Mutex
	peers    map[string]*peer     // by host:port
	departed map[string]time.Time // peers gone from discovery, by host:port, when (departed.go)
}

// New builds the peer set of cfg (defaults applied, validated): static
// endpoints are known at once, DNS ones after the first refresh (Run does one
// before it waits). reg may be nil.
func New(logger *slog.Logger, reg prometheus.Registerer, cfg Config, opts Options) (*Set, error) {
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Set{
		logger:     logger,
		cfg:        cfg,
		instance:   hex.EncodeToString(id[:]),
		resolver:   opts.Resolver,
		now:        opts.Now,
		synced:     opts.BucketSynced,
		m:          newMetrics(reg),
		peers:      map[string]*peer{},
		departed:   map[string]time.Time{},
		probeEvery: probeInterval,
	}
	s.m.unreachable = promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Name: "phonehome_peers_unreachable",
		Help: "Peers that could not be connected to (by a call, or by the check of every peer's /-/ready each peers.refresh_interval), skipped by queries (a warning each) until they answer a probe of /-/ready again.",
	}, s.unreachable)
	if s.resolver == nil {
		s.resolver = net.DefaultResolver
	}
	if s.now == nil {
		s.now = time.Now
	}
	switch {
	case opts.HTTPClient != nil && opts.HTTPClient.Transport != nil:
		s.base = opts.HTTPClient.Transport
	case opts.HTTPClient != nil:
		s.base = http.DefaultTransport
	default:
		s.base = http.DefaultTransport.(*http.Transport).Clone()
	}
	for _, e := range cfg.Endpoints {
		ep, err := parseEndpoint(e)
		if err != nil {
			return nil, err
		}
		s.endpoints = append(s.endpoints, ep)
	}
	if err := s.loadTokens(); err != nil {
		return nil, err
	}
	var static []string
	for _, ep := range s.endpoints {
		if ep.kind == "" {
			static = append(static, net.JoinHostPort(ep.host, ep.port))
		}
	}
	s.setPeers(static)
	return s, nil
}

// Instance is this process' random id, sent in InstanceHeader so that a
// receiver that discovers itself (a headless Service lists every pod) can
// tell.
func (s *Set) Instance() string { return s.instance }

// Enabled reports whether any peer endpoint is configured.
func (s *Set) Enabled() bool { return len(s.endpoints) > 0 }

// Run resolves the DNS endpoints and re-reads the token files every refresh
// interval until ctx ends. Failures are logged (a discovery's also
// counted); the previous peers and tokens stay. It also probes the peers
// marked unreachable (reachability.go), and checks the others every
// refresh interval (health.go).
func (s *Set) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.probeLoop(ctx) })
	wg.Go(func() { s.healthLoop(ctx) })
	for {
		s.Refresh(ctx)
		t := time.NewTimer(time.Duration(s.cfg.RefreshInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Refresh resolves the endpoints and re-reads the token files once.
func (s *Set) Refresh(ctx context.Context) {
	_ = s.ReloadTokens() // logged
	if !s.Enabled() {
		return
	}
	var (
		addrs  []string
		failed bool
	)
	for _, ep := range s.endpoints {
		got, err := s.resolve(ctx, ep)
		if err != nil {
			failed = true
			s.logger.Warn("resolve peers", "endpoint", ep.host, "err", err)
			continue
		}
		addrs = append(addrs, got...)
	}
	if failed {
		// Keep every peer known before: a DNS hiccup must not drop peers.
		s.m.discoveries.WithLabelValues("error").Inc()
		s.mu.Lock()
		for a := range s.peers {
			addrs = append(addrs, a)
		}
		s.mu.Unlock()
	} else {
		s.m.discoveries.WithLabelValues("success").Inc()
	}
	s.setPeers(addrs)
}

func (s *Set) resolve(ctx context.Context, ep endpoint) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch ep.kind {
	case "":
		return []string{net.JoinHostPort(ep.host, ep.port)}, nil
	case "dns":
		ips, err := s.resolver.LookupIPAddr(ctx, ep.host)
		if err != nil {
			return nil, err
		}
		out := make([]string, 0, len(ips))
		for _, ip := range ips {
			out = append(out, net.JoinHostPort(ip.IP.String(), ep.port))
		}
		return out, nil
	default: // dnssrv
		_, srvs, err := s.resolver.LookupSRV(ctx, "", "", ep.host)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, srv := range srvs {
			ips, err := s.resolver.LookupIPAddr(ctx, srv.Target)
			if err != nil {
				return nil, fmt.Errorf("resolve SRV target %s: %w", srv.Target, err)
			}
			for _, ip := range ips {
				out = append(out, net.JoinHostPort(ip.IP.String(), strconv.Itoa(int(srv.Port))))
			}
		}
		return out, nil
	}
}

// setPeers replaces the peer set, keeping the state of peers that stay.
func (s *Set) setPeers(addrs []string) {
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[string]*peer, len(addrs))
	for _, a := range addrs {
		delete(s.departed, a)
		if p, ok := s.peers[a]; ok {
			next[a] = p
			continue
		}
		p, err := s.newPeer(a)
		if err != nil { // only an unparsable URL; validated endpoints never are
			s.logger.Warn("peer client", "peer", a, "err", err)
			continue
		}
		next[a] = p
	}
	s.departLocked(next)
	s.peers = next
	s.countLocked()
}

// countLocked updates the peers gauge. s.mu must be held.
func (s *Set) countLocked() {
	n := 0
	for _, p := range s.peers {
		if !p.self.Load() {
			n++
		}
	}
	s.m.peers.Set(float64(n))
}

// snapshot returns the current peers other than this receiver.
func (s *Set) snapshot() []*peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*peer, 0, len(s.peers))
	for _, p := range s.peers {
		if !p.self.Load() {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *peer) int { return strings.Compare(a.addr, b.addr) })
	return out
}

// ReloadTokens re-reads the token files, as Refresh does every refresh
// interval and the receiver's SIGHUP and POST /-/reload do on demand. If
// one cannot be read, the error is logged and returned, and the previous
// tokens stay.
func (s *Set) ReloadTokens() error {
	if err := s.loadTokens(); err != nil {
		s.m.tokenLoads.WithLabelValues("failure").Inc()
		s.logger.Error("re-read peer token files, keeping the previous tokens", "err", err)
		return err
	}
	s.m.tokenLoads.WithLabelValues("success").Inc()
	return nil
}

// loadTokens reads every token file, then puts them in force together: a
// file that cannot be read keeps all the previous tokens. Loads are
// serialized, so that a slower one never stores older contents over a
// newer one's.
func (s *Set) loadTokens() error {
	s.tokensMu.Lock()
	defer s.tokensMu.Unlock()
	var replica []string
	if f := s.cfg.ReplicaTokenFile; f != "" {
		toks, err := readTokens(f)
		if err != nil {
			return fmt.Errorf("peers.replica_token_file: %w", err)
		}
		replica = toks
	}
	toks := map[string]string{}
	for t, f := range s.cfg.TenantTokenFiles {
		tok, err := readToken(f)
		if err != nil {
			return fmt.Errorf("peers.tenant_token_files.%s: %w", t, err)
		}
		toks[t] = tok
	}
	if replica != nil {
		s.replicaToken.Store(&replica)
	}
	s.tenantTokens.Store(&toks)
	return nil
}

// credential returns the Authorization token for reading tenant from a
// peer, and whether it is the replica token (which needs TenantHeader).
func (s *Set) credential(tenant string) (token string, replica bool) {
	if m := s.tenantTokens.Load(); m != nil {
		if tok, ok := (*m)[tenant]; ok {
			return tok, false
		}
	}
	if toks := s.replicaToken.Load(); toks != nil {
		return (*toks)[0], true
	}
	return "", false
}

// Tenants returns the tenants named in peers.tenant_token_files: tenants
// whose data may live only in a peer's head (see rules).
func (s *Set) Tenants() []string {
	var out []string
	if m := s.tenantTokens.Load(); m != nil {
		for t := range *m {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

type metrics struct {
	peers       prometheus.Gauge
	discoveries *prometheus.CounterVec
	tokenLoads  *prometheus.CounterVec
	reads       *prometheus.CounterVec
	labelCalls  *prometheus.CounterVec
	duration    prometheus.Histogram
	unreachable prometheus.GaugeFunc // set by New: it counts the Set's peers
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		peers: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_peers", Help: "Peer replicas queries read from (this receiver excluded).",
		}),
		discoveries: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_peers_discoveries_total", Help: "Resolutions of the peer endpoints, by result.",
		}, []string{"result"}),
		tokenLoads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_peers_token_reloads_total",
			Help: "Reloads of the peers' token files (every refresh interval, SIGHUP, POST /-/reload) by result (success, failure: the previous tokens stay in force).",
		}, []string{"result"}),
		reads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_peers_reads_total",
			Help: "Reads of a peer's local data by result: success, error (the query answered without that peer, with a warning), skipped (the range is in the bucket).",
		}, []string{"result"}),
		labelCalls: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_peers_label_calls_total",
			Help: "Index calls answered by a peer, by call (labels: label names and values; series: /api/v1/series) and how: labels (its local-scope endpoint, from its index), series (its series over remote read: a peer without the endpoint, as during a rolling upgrade, or a label values call whose match[] is too long for its URL).",
		}, []string{"call", "via"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "phonehome_peers_read_duration_seconds", Help: "Time until a peer's answer started (remote read, pushdown, metadata, label and series calls).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
		}),
	}
	for _, r := range []string{"success", "error"} {
		m.discoveries.WithLabelValues(r)
	}
	for _, r := range []string{"success", "failure"} {
		m.tokenLoads.WithLabelValues(r)
	}
	for _, r := range []string{"success", "error", "skipped"} {
		m.reads.WithLabelValues(r)
	}
	for _, c := range []string{callLabels, callSeries} {
		for _, v := range []string{"labels", "series"} {
			m.labelCalls.WithLabelValues(c, v)
		}
	}
	return m
}
