package forward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Credentials supplies the bearer token of requests to the receiver.
//
// Token returns the token to use now. Rejected reports that the receiver
// answered 401 to token; it returns true if asking Token again may yield a
// different token (the caller then retries its request once). Both are safe
// for concurrent use.
type Credentials interface {
	Token(ctx context.Context) (string, error)
	Rejected(token string) bool
}

// TokenFile is a static bearer token read from a file before every request,
// so it can rotate on disk. The empty TokenFile sends no token.
type TokenFile string

// Token implements Credentials.
func (f TokenFile) Token(context.Context) (string, error) {
	if f == "" {
		return "", nil
	}
	b, err := os.ReadFile(string(f))
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// telemeterServer reports whether the fleet endpoint is a stock
// telemeter-server, as its last /authorize answer said (false before the
// first answer and in direct mode). Such a server stores every upload at
// the time it arrives (see StoresAtArrival).
func (a *Authorizer) telemeterServer() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fromTelemeterServer && !a.direct
}

// known reports whether an answer to /authorize (or its absence: direct
// mode) has told what the fleet endpoint is; false before the first.
func (a *Authorizer) known() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur != nil || a.direct || a.fromTelemeterServer
}

// Rejected implements Credentials: a static token does not change by asking again.
func (TokenFile) Rejected(string) bool { return false }

// Authorize modes (--authorize).
const (
	// AuthorizeAuto exchanges the token at <to>/authorize; if the receiver
	// has no such endpoint (404/405) the token is used directly instead.
	AuthorizeAuto = "auto"
	// AuthorizeAlways always exchanges; a receiver without /authorize is an
	// error, retried with backoff.
	AuthorizeAlways = "always"
	// AuthorizeNever uses the token directly for writes (no Authorizer).
	AuthorizeNever = "never"
)

// ErrAuthorize wraps every failure to obtain a cluster credential.
var ErrAuthorize = errors.New("authorize")

// AuthorizerOptions configures an Authorizer.
type AuthorizerOptions struct {
	Mode string // AuthorizeAuto (default) or AuthorizeAlways
	// TokenFile holds the fleet token; it is re-read before every exchange.
	TokenFile string
	// ClusterID is the cluster's pseudonymous (hashed) id, sent as form
	// field id. Never the raw id.
	ClusterID string
	// RenewAt is the fraction of a credential's lifetime after which it is
	// renewed (default 0.8); Jitter subtracts a random [0, Jitter) more, so
	// a fleet does not renew in lockstep, and stretches a server's
	// Retry-After by up to 10 %. 0 (unset) means min(0.1, RenewAt/2), as
	// does a value >= RenewAt; NoJitter (any negative value) turns both off.
	RenewAt, Jitter float64
	// MinBackoff and MaxBackoff bound the retries of a failed exchange
	// (defaults 1s and 1m). A server's Retry-After is honoured up to MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	Timeout                time.Duration // one exchange (default 30s)
	UserAgent              string
	// Token is an inline fleet token, used when TokenFile is empty
	// (telemeter-client's --to-token; the file is preferred).
	Token string
	// URL, if set, replaces <base>/authorize (telemeter-client's --to-auth).
	URL string
}

func (o *AuthorizerOptions) defaults() {
	if o.Mode == "" {
		o.Mode = AuthorizeAuto
	}
	if o.RenewAt <= 0 || o.RenewAt >= 1 {
		o.RenewAt = 0.8
	}
	if o.Jitter == 0 || o.Jitter >= o.RenewAt { // negative: NoJitter, kept
		o.Jitter = min(DefaultJitter, o.RenewAt/2)
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(time.Minute, o.MinBackoff)
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
}

// credential is a cluster credential issued by /authorize, with local times
// derived from expires_in_seconds (so clock skew does not matter).
type credential struct {
	token            string
	expires, renewAt time.Time
	// labels must be on every series sent with token (telemeter's "labels").
	labels map[string]string
	// telemeter: the answer had only telemeter-server's fields (no tenant,
	// no expires_in_seconds), so the endpoint is a stock telemeter-server.
	telemeter bool
}

// Authorizer exchanges the fleet token and the hashed cluster id for a
// short-lived cluster credential at <to>/authorize (the telemeter flow),
// renews it before it expires and re-authorizes when the receiver rejects it.
// It implements Credentials. Run renews in the background; Token also
// exchanges on demand when there is no valid credential.
type Authorizer struct {
	logger *slog.Logger
	url    string
	client *http.Client
	opts   AuthorizerOptions
	now    func() time.Time

	// exchanging serializes exchanges: a one-slot semaphore, so that a
	// caller waiting for another's exchange gives up when its ctx ends.
	exchanging chan struct{}

	mu     sync.Mutex
	cur    *credential
	direct bool // auto mode found no /authorize: the fleet token is used directly
	// fromTelemeterServer: the last answer to /authorize came from a stock
	// telemeter-server (kept while its credential is renewed or replaced).
	fromTelemeterServer bool
	// notBefore is when the receiver's last Retry-After on /authorize ends:
	// until then no exchange is attempted, by Run or by the write path.
	notBefore time.Time
	// retryAt is when Run retries its last failed exchange (lastErr):
	// until then Token answers with that error instead of exchanging on
	// its own, so a fleet's write paths do not add attempts to Run's
	// backoff while the receiver is down.
	retryAt time.Time
	lastErr error

	kick chan struct{} // wakes Run after Rejected

	waitingForExchange func() // tests: a caller waits for another's exchange

	requests *prometheus.CounterVec
	expiry   prometheus.Gauge
	rejected prometheus.Counter
}

// NewAuthorizer returns an Authorizer for the receiver at base. reg may be nil.
func NewAuthorizer(logger *slog.Logger, reg prometheus.Registerer, base *url.URL, client *http.Client, opts AuthorizerOptions) *Authorizer {
	opts.defaults()
	u := *base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/authorize"
	authURL := u.String()
	if opts.URL != "" {
		authURL = opts.URL
	}
	f := promauto.With(reg)
	a := &Authorizer{
		logger: logger, url: authURL, client: client, opts: opts, now: time.Now,
		kick: make(chan struct{}, 1), exchanging: make(chan struct{}, 1),
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_authorize_requests_total",
			Help: "Credential exchanges at the receiver's /authorize by result (success, unauthorized, forbidden, unavailable, not_found, error).",
		}, []string{"result"}),
		expiry: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_credential_expiry_timestamp_seconds",
			Help: "Unix time at which the cluster credential in use expires (0: none).",
		}),
		rejected: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_forward_credential_rejections_total",
			Help: "Requests the receiver answered 401 to with a cluster credential (each causes one re-authorization).",
		}),
	}
	for _, r := range []string{"success", "unauthorized", "forbidden", "unavailable", "not_found", "error"} {
		a.requests.WithLabelValues(r)
	}
	return a
}

// Token implements Credentials: the current credential, or a fresh one
// exchanged now if there is none or it is about to expire.
func (a *Authorizer) Token(ctx context.Context) (string, error) {
	if tok, ok, err := a.current(); ok || err != nil {
		return tok, err
	}
	if err := a.refresh(ctx, false); err != nil {
		var ra *retryAfterError
		if errors.As(err, &ra) && ra.after > 0 { // the write path waits as long
			return "", RetryableError{Err: err, RetryAfter: ra.after}
		}
		return "", err
	}
	tok, ok, err := a.current()
	if err == nil && !ok {
		err = fmt.Errorf("%w: no credential", ErrAuthorize)
	}
	return tok, err
}

// current returns the usable token, if any.
func (a *Authorizer) current() (string, bool, error) {
	a.mu.Lock()
	direct, c := a.direct, a.cur
	a.mu.Unlock()
	if direct {
		tok, err := a.fleetToken(context.Background())
		return tok, err == nil, err
	}
	if c != nil && a.now().Before(c.expires) {
		return c.token, true, nil
	}
	return "", false, nil
}

// backingOff is how long Run still waits before it retries its last
// failed exchange, and that exchange's error.
func (a *Authorizer) backingOff() (time.Duration, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.retryAt.Sub(a.now()), a.lastErr
}

// setRetry records Run's next attempt after err (none: zero wait).
func (a *Authorizer) setRetry(wait time.Duration, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.retryAt, a.lastErr = a.now().Add(wait), err
}

// holdOff is how long the receiver's last Retry-After still runs.
func (a *Authorizer) holdOff() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.notBefore.Sub(a.now())
}

// Rejected implements Credentials: the credential is dropped, so the next
// Token call re-authorizes; in direct mode /authorize is asked again, in
// case the receiver gained it.
func (a *Authorizer) Rejected(token string) bool {
	a.rejected.Inc()
	a.mu.Lock()
	if a.cur != nil && a.cur.token == token {
		a.cur = nil
		a.expiry.Set(0)
	}
	a.mu.Unlock()
	a.reprobe()
	return true
}

// reprobe makes the next Token ask /authorize again after auto mode took
// its 404 or 405 for "no such endpoint" (Rejected,
// ProtocolSender.noWriteEndpoint), and wakes Run.
func (a *Authorizer) reprobe() {
	a.mu.Lock()
	a.direct = false
	a.retryAt = time.Time{} // Run asks again now
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// refresh exchanges the fleet token for a new credential. Unless force is
// set (Run), it returns at once if another caller obtained one meanwhile,
// or with Run's last error while Run waits to retry it.
func (a *Authorizer) refresh(ctx context.Context, force bool) error {
	if err := a.lockExchange(ctx); err != nil {
		return err
	}
	defer a.unlockExchange()
	return a.refreshLocked(ctx, force)
}

// lockExchange takes the exchange slot, or returns ctx's error once ctx
// ends first (another caller's exchange may take authorize.timeout).
func (a *Authorizer) lockExchange(ctx context.Context) error {
	select {
	case a.exchanging <- struct{}{}:
		return nil
	default:
	}
	if a.waitingForExchange != nil {
		a.waitingForExchange()
	}
	select {
	case a.exchanging <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the exchange in progress: %w", ErrAuthorize, ctx.Err())
	}
}

func (a *Authorizer) unlockExchange() { <-a.exchanging }

// refreshLocked is refresh holding the exchange slot (lockExchange).
func (a *Authorizer) refreshLocked(ctx context.Context, force bool) error {
	if !force {
		if _, ok, _ := a.current(); ok {
			return nil
		}
		if wait, err := a.backingOff(); wait > 0 {
			return &retryAfterError{err: err, after: wait}
		}
	}
	if hold := a.holdOff(); hold > 0 {
		return &retryAfterError{err: fmt.Errorf("%w: the receiver asked to retry in %s", ErrAuthorize, hold.Round(time.Second)), after: hold}
	}
	return a.exchange(ctx)
}

// fleetToken is the token to exchange (or, in direct mode, to use).
func (a *Authorizer) fleetToken(ctx context.Context) (string, error) {
	if a.opts.TokenFile == "" && a.opts.Token != "" {
		return a.opts.Token, nil
	}
	return TokenFile(a.opts.TokenFile).Token(ctx)
}

// maxAuthorizeRetryAfter caps how long a Retry-After on /authorize is
// honoured, as Options.MaxRetryAfter's default caps it on writes.
const maxAuthorizeRetryAfter = 10 * time.Minute

// retryAfterError carries a server's Retry-After out of exchange.
type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

func (a *Authorizer) exchange(ctx context.Context) error {
	result := "error"
	defer func() { a.requests.WithLabelValues(result).Inc() }()
	fleet, err := a.fleetToken(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrAuthorize, err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.opts.Timeout)
	defer cancel()
	form := url.Values{"id": {a.opts.ClusterID}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, strings.NewReader(form))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrAuthorize, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+fleet)
	if a.opts.UserAgent != "" {
		req.Header.Set("User-Agent", a.opts.UserAgent)
	}
	start := a.now()
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrAuthorize, err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	switch code := resp.StatusCode; {
	case code == http.StatusOK, code == http.StatusCreated: // telemeter-client accepts both
	case (code == http.StatusNotFound || code == http.StatusMethodNotAllowed) && a.opts.Mode == AuthorizeAuto:
		result = "not_found"
		a.mu.Lock()
		first := !a.direct
		a.direct, a.cur, a.fromTelemeterServer = true, nil, false
		a.mu.Unlock()
		if first {
			a.logger.Info("the receiver has no /authorize endpoint, using the token directly", "status", code)
		}
		return nil
	default:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		herr := &HTTPError{Code: code, Message: strings.TrimSpace(string(msg))}
		switch {
		case code == http.StatusUnauthorized:
			result = "unauthorized"
		case code == http.StatusForbidden:
			result = "forbidden"
		case code == http.StatusTooManyRequests || code/100 == 5:
			result = "unavailable"
		}
		after := min(parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), maxAuthorizeRetryAfter)
		if after > 0 {
			a.mu.Lock()
			a.notBefore = a.now().Add(after)
			a.mu.Unlock()
		}
		return &retryAfterError{err: fmt.Errorf("%w: %w", ErrAuthorize, herr), after: after}
	}
	// Our receiver answers {token, expires_in_seconds, tenant, ...} (and,
	// for telemeter-client, telemeter's fields too); a stock
	// telemeter-server answers {version, token, expiresInSeconds, labels}.
	var out struct {
		Token            string            `json:"token"`
		ExpiresInSeconds *int64            `json:"expires_in_seconds"`
		Tenant           *string           `json:"tenant"`
		TelemeterExpires int64             `json:"expiresInSeconds"`
		Labels           map[string]string `json:"labels"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&out); err != nil {
		return fmt.Errorf("%w: decode answer: %w", ErrAuthorize, err)
	}
	telemeter := out.ExpiresInSeconds == nil && out.Tenant == nil
	var secs int64
	switch {
	case out.ExpiresInSeconds != nil:
		secs = *out.ExpiresInSeconds
	case telemeter && out.TelemeterExpires > 0:
		secs = out.TelemeterExpires
	case telemeter:
		// telemeter-client keeps a token without a lifetime until a 401;
		// we renew it hourly instead.
		secs = 3600
	}
	if out.Token == "" || secs <= 0 {
		return fmt.Errorf("%w: answer without token or lifetime", ErrAuthorize)
	}
	// Saturate: a lifetime beyond a Duration is a long one, not (wrapped
	// around) an expired credential that would be exchanged again at once.
	life := time.Duration(min(secs, int64(math.MaxInt64/time.Second))) * time.Second
	frac := a.opts.RenewAt - max(a.opts.Jitter, 0)*rand.Float64()
	c := &credential{
		token: out.Token, labels: out.Labels, telemeter: telemeter,
		// Expire a little early so a request in flight does not carry a
		// credential that lapses on the way.
		expires: start.Add(life - min(10*time.Second, life/10)),
		renewAt: start.Add(time.Duration(frac * float64(life))),
	}
	a.mu.Lock()
	a.cur, a.direct, a.fromTelemeterServer = c, false, telemeter
	a.mu.Unlock()
	a.expiry.Set(float64(start.Add(life).Unix()))
	result = "success"
	a.logger.Debug("cluster credential obtained", "expires_in", life.String(), "renew_in", c.renewAt.Sub(start).String())
	return nil
}

// Run exchanges at once, then renews each credential at its renewal time
// until ctx ends. Failed exchanges are retried with capped, jittered
// exponential backoff (or the server's Retry-After); meanwhile a credential
// that has not expired stays in use. Run returns nil when ctx ends.
func (a *Authorizer) Run(ctx context.Context) error {
	attempt := 0
	var wait time.Duration
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-a.kick:
				t.Stop()
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		a.mu.Lock()
		direct, c := a.direct, a.cur
		a.mu.Unlock()
		switch {
		case direct:
			wait = 24 * time.Hour // until Rejected kicks
			continue
		case c != nil && a.now().Before(c.renewAt):
			wait = c.renewAt.Sub(a.now())
			continue
		}
		// The retry is recorded before the exchange slot is released, so
		// that a Token waiting for it takes Run's failure instead of
		// exchanging.
		if a.lockExchange(ctx) != nil {
			return nil
		}
		err := a.refreshLocked(ctx, true)
		switch {
		case err == nil:
			attempt, wait = 0, 0
			a.setRetry(0, nil)
		case ctx.Err() == nil:
			wait = a.retryWait(attempt, err)
			a.setRetry(wait, err)
		}
		a.unlockExchange()
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		if attempt == 0 {
			a.logger.Warn("authorize failed, retrying", "err", err, "retry_in", wait.String())
		} else {
			a.logger.Debug("authorize failed, retrying", "err", err, "attempt", attempt+1, "retry_in", wait.String())
		}
		attempt++
	}
}

// retryWait is Run's wait before it retries the failed exchange attempt
// (0-based) that returned err.
func (a *Authorizer) retryWait(attempt int, err error) time.Duration {
	var ra *retryAfterError
	if errors.As(err, &ra) && ra.after > 0 {
		wait := ra.after       // capped at maxAuthorizeRetryAfter, not max_backoff: the receiver sheds load
		if a.opts.Jitter > 0 { // the same Retry-After went to every forwarder refused
			wait = stretch(wait, DefaultJitter)
		}
		return wait
	}
	return Backoff(attempt, a.opts.MinBackoff, a.opts.MaxBackoff)
}

// Backoff is the wait before retry attempt (0-based): capped exponential
// from minD to maxD with "equal jitter" (half fixed, half random). Shared by
// every retry loop of the forwarder and the receiver's upstream mode.
func Backoff(attempt int, minD, maxD time.Duration) time.Duration {
	d := cappedExp(attempt, minD, maxD)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
