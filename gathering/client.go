package gathering

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Poll failure reasons (values of the reason label).
const (
	ReasonUnreachable  = "unreachable"  // transport error or timeout
	ReasonUnauthorized = "unauthorized" // 401/403, or no credential
	ReasonHTTP         = "http_status"  // any other non-200/304 status
	ReasonTooLarge     = "too_large"    // over MaxBytes or a count limit
	ReasonMalformed    = "malformed"    // not JSON, unknown fields, trailing data
	ReasonInvalid      = "invalid"      // a selector, label or cap is invalid
	ReasonTooOld       = "forwarder_too_old"
	ReasonApply        = "apply" // the forwarder could not build its policy from it
)

// Credentials supplies the bearer token of a poll; forward.Authorizer and
// forward.TokenFile implement it. Rejected reports a 401 and returns true if
// a new token may help (the poll is then retried once).
type Credentials interface {
	Token(ctx context.Context) (string, error)
	Rejected(token string) bool
}

// PollerOptions configures a Poller.
type PollerOptions struct {
	URL         string
	Client      *http.Client
	Credentials Credentials   // may be nil: no Authorization header
	Interval    time.Duration // between polls (default 2h)
	// Jitter spreads polls: each wait is Interval ± Jitter×Interval. 0
	// (unset) and values >= 1 mean 0.1; a negative value turns it off.
	Jitter float64
	// RetryMin is the wait after a failed poll (default 1m), doubled per
	// consecutive failure, with equal jitter, up to Interval: a forwarder
	// that starts while the receiver is unreachable gets its definition
	// within minutes, not an Interval later.
	RetryMin time.Duration
	Timeout  time.Duration // one poll (default 30s)
	// CacheFile keeps the last good definition across restarts ("" disables).
	CacheFile        string
	UserAgent        string
	ForwarderVersion string // checked against min_forwarder_version
	// Apply puts a validated definition in force for the next cycle, all or
	// nothing; an error keeps the previous one (counted as ReasonApply).
	Apply func(*Compiled) error
}

// Poller is the forwarder's side: it polls the definition with
// If-None-Match, validates it, applies it atomically and caches it on disk.
// A failed poll keeps the definition in force and is counted by reason.
type Poller struct {
	logger *slog.Logger
	opts   PollerOptions

	pollMu sync.Mutex // serializes polls
	// mu guards the state below. A poll holds it to apply a definition, not
	// while it fetches one: a Reapply (a forwarder reload) does not wait for
	// the network.
	mu      sync.Mutex
	etag    string    // of the definition in force, from the fleet or the cache
	inUse   string    // version in force
	inForce *Compiled // the definition in force; nil while local selectors or nothing is

	polls       *prometheus.CounterVec
	failures    *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	bodyBytes   prometheus.Counter
	info        *prometheus.GaugeVec
}

// NewPoller returns a Poller. reg may be nil.
func NewPoller(logger *slog.Logger, reg prometheus.Registerer, opts PollerOptions) *Poller {
	if opts.Interval <= 0 {
		opts.Interval = 2 * time.Hour
	}
	if opts.Jitter == 0 || opts.Jitter >= 1 { // negative: off, kept
		opts.Jitter = 0.1
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = time.Minute
	}
	f := promauto.With(reg)
	p := &Poller{
		logger: logger, opts: opts,
		polls: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_gathering_polls_total",
			Help: "Polls of the gathering definition by result (updated, not_modified, failed).",
		}, []string{"result"}),
		failures: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_gathering_poll_failures_total",
			Help: "Failed polls of the gathering definition by reason; the definition in force stays.",
		}, []string{"reason"}),
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_gathering_last_success_timestamp_seconds",
			Help: "Unix time of the last successful poll (updated or not modified).",
		}),
		bodyBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_forward_gathering_body_bytes_total",
			Help: "Bytes of gathering definition bodies received.",
		}),
		info: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "phonehome_forward_gathering_definition_info",
			Help: "The gathering definition in force (value 1), by version and source (fleet, cache, local).",
		}, []string{"version", "source"}),
	}
	for _, r := range []string{"updated", "not_modified", "failed"} {
		p.polls.WithLabelValues(r)
	}
	for _, r := range []string{ReasonUnreachable, ReasonUnauthorized, ReasonHTTP, ReasonTooLarge, ReasonMalformed, ReasonInvalid, ReasonTooOld, ReasonApply} {
		p.failures.WithLabelValues(r)
	}
	return p
}

// cacheFile is the on-disk cache: the served body and its ETag.
type cacheFile struct {
	ETag       string          `json:"etag"`
	FetchedAt  time.Time       `json:"fetched_at"`
	Definition json.RawMessage `json:"definition"`
}

// LoadCache reads, validates and applies the cached definition. It returns
// an error (and applies nothing) if there is no usable cache.
func (p *Poller) LoadCache() (*Compiled, error) {
	if p.opts.CacheFile == "" {
		return nil, errors.New("no cache file configured")
	}
	b, err := os.ReadFile(p.opts.CacheFile)
	if err != nil {
		return nil, fmt.Errorf("read cache: %w", err)
	}
	var cf cacheFile
	if err := json.Unmarshal(b, &cf); err != nil {
		return nil, fmt.Errorf("cache %s: %w", p.opts.CacheFile, err)
	}
	c, _, err := p.check(cf.Definition)
	if err != nil {
		return nil, fmt.Errorf("cache %s: %w", p.opts.CacheFile, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.opts.Apply(c); err != nil {
		return nil, fmt.Errorf("cache %s: apply: %w", p.opts.CacheFile, err)
	}
	p.etag = cf.ETag
	p.inForce = c
	p.setInUse(c.Def.Version, "cache")
	return c, nil
}

// UseLocal records that the local selectors are in force (no definition yet).
func (p *Poller) UseLocal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inForce = nil
	p.setInUse("local", "local")
}

// Reapply rebuilds what is in force, for when what Apply builds on changed
// (the forwarder's relabel rules, on a configuration reload): it calls
// definition with the definition in force or, while none is, local, which
// reports whether it put the local selectors in force. Polls wait until it
// returns, so a new definition is never overwritten by an older one, nor
// applied over what definition is replacing. An error keeps what is in force.
func (p *Poller) Reapply(definition func(*Compiled) error, local func() (bool, error)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inForce != nil {
		if err := definition(p.inForce); err != nil {
			return fmt.Errorf("reapply gathering definition %s: %w", p.inForce.Def.Version, err)
		}
		return nil
	}
	ok, err := local()
	if err != nil {
		return err
	}
	if ok {
		p.setInUse("local", "local")
	}
	return nil
}

func (p *Poller) setInUse(version, source string) {
	p.inUse = version
	p.info.Reset()
	p.info.WithLabelValues(version, source).Set(1)
}

// check decodes, validates, compiles and version-checks a body; the string
// is the failure reason.
func (p *Poller) check(body []byte) (*Compiled, string, error) {
	d, err := Decode(body)
	switch {
	case errors.Is(err, ErrTooLarge):
		return nil, ReasonTooLarge, err
	case errors.Is(err, ErrMalformed):
		return nil, ReasonMalformed, err
	case err != nil:
		return nil, ReasonInvalid, err
	}
	if err := d.Allows(p.opts.ForwarderVersion); err != nil {
		return nil, ReasonTooOld, err
	}
	c, err := Compile(d)
	if err != nil {
		return nil, ReasonInvalid, err
	}
	return c, "", nil
}

// Poll fetches the definition once. Not modified, or a new valid definition
// applied, is success; anything else is counted by reason and returned, and
// the definition in force stays.
func (p *Poller) Poll(ctx context.Context) error {
	p.pollMu.Lock()
	defer p.pollMu.Unlock()
	reason, err := p.poll(ctx)
	if err != nil {
		p.polls.WithLabelValues("failed").Inc()
		p.failures.WithLabelValues(reason).Inc()
		return err
	}
	p.lastSuccess.SetToCurrentTime()
	return nil
}

func (p *Poller) poll(ctx context.Context) (reason string, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	p.mu.Lock()
	etag := p.etag
	p.mu.Unlock()
	var resp *http.Response
	for attempt := 0; ; attempt++ {
		tok := ""
		if p.opts.Credentials != nil {
			if tok, err = p.opts.Credentials.Token(ctx); err != nil {
				return ReasonUnauthorized, fmt.Errorf("gathering poll credential: %w", err)
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.opts.URL, nil)
		if err != nil {
			return ReasonUnreachable, fmt.Errorf("gathering poll: %w", err)
		}
		req.Header.Set("Accept", "application/json")
		if etag != "" {
			req.Header.Set("If-None-Match", etag)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		if p.opts.UserAgent != "" {
			req.Header.Set("User-Agent", p.opts.UserAgent)
		}
		resp, err = p.opts.Client.Do(req)
		if err != nil {
			return ReasonUnreachable, fmt.Errorf("gathering poll: %w", err)
		}
		if resp.StatusCode == http.StatusUnauthorized && attempt == 0 && tok != "" && p.opts.Credentials.Rejected(tok) {
			drain(resp)
			continue
		}
		break
	}
	defer drain(resp)
	switch resp.StatusCode {
	case http.StatusNotModified:
		p.polls.WithLabelValues("not_modified").Inc()
		return "", nil
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden:
		return ReasonUnauthorized, fmt.Errorf("gathering poll: HTTP %d", resp.StatusCode)
	default:
		return ReasonHTTP, fmt.Errorf("gathering poll: HTTP %d", resp.StatusCode)
	}
	if resp.ContentLength > MaxBytes {
		return ReasonTooLarge, fmt.Errorf("gathering poll: %w: Content-Length %d", ErrTooLarge, resp.ContentLength)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBytes+1))
	p.bodyBytes.Add(float64(len(body)))
	if err != nil {
		return ReasonUnreachable, fmt.Errorf("gathering poll: read body: %w", err)
	}
	c, reason, err := p.check(body)
	if err != nil {
		p.logger.Warn("gathering definition refused, keeping the one in force", "in_use", p.inUseVersion(), "reason", reason, "err", err)
		return reason, err
	}
	etag = resp.Header.Get("ETag")
	if etag == "" {
		etag = c.ETag
	}
	if err := p.apply(c, etag); err != nil {
		return ReasonApply, err
	}
	// Outside mu: pollMu orders the cache writes, and a Reapply need not
	// wait for the disk.
	if err := p.writeCache(etag, body); err != nil {
		p.logger.Warn("cache gathering definition", "file", p.opts.CacheFile, "err", err)
	}
	return "", nil
}

// apply puts c, fetched with etag, in force.
func (p *Poller) apply(c *Compiled, etag string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.opts.Apply(c); err != nil {
		p.logger.Warn("gathering definition not applicable, keeping the one in force", "in_use", p.inUse, "version", c.Def.Version, "err", err)
		return err
	}
	p.etag = etag
	p.inForce = c
	p.setInUse(c.Def.Version, "fleet")
	p.polls.WithLabelValues("updated").Inc()
	p.logger.Info("gathering definition applied", "version", c.Def.Version, "selectors", len(c.Def.Selectors))
	return nil
}

func (p *Poller) inUseVersion() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inUse
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// writeCache replaces the cache atomically (temporary file, fsync, rename).
func (p *Poller) writeCache(etag string, body []byte) error {
	if p.opts.CacheFile == "" {
		return nil
	}
	b, err := json.Marshal(cacheFile{ETag: etag, FetchedAt: time.Now().UTC(), Definition: body})
	if err != nil {
		return err
	}
	return writeFileAtomic(p.opts.CacheFile, b)
}

// Run polls at once, then every Interval ± Jitter, until ctx ends; after a
// failed poll sooner (wait).
func (p *Poller) Run(ctx context.Context) error {
	failures := 0
	for {
		failures++
		if err := p.Poll(ctx); err == nil {
			failures = 0
		} else if ctx.Err() == nil {
			p.logger.Debug("gathering poll failed", "err", err, "consecutive_failures", failures)
		}
		t := time.NewTimer(p.wait(failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// wait is the time to the next poll after consecutive failed polls:
// Interval ± Jitter after a success; else RetryMin·2ⁿ with equal jitter
// (a random half to all of it, so a fleet that failed together does not
// retry together), until that reaches Interval.
func (p *Poller) wait(failures int) time.Duration {
	if failures > 0 {
		d := p.opts.RetryMin
		for i := 1; i < failures && d < p.opts.Interval; i++ {
			d *= 2
		}
		if d < p.opts.Interval {
			return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
		}
	}
	return time.Duration(float64(p.opts.Interval) * (1 + max(p.opts.Jitter, 0)*(2*rand.Float64()-1)))
}
