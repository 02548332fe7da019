package forward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// authReceiver is a fake receiver with POST /authorize and POST /api/v1/write.
// Credentials are "cred-<n>"; a write with a credential that is not valid is 401.
type authReceiver struct {
	mu         sync.Mutex
	srv        *httptest.Server
	ids        []string // form ids sent to /authorize
	fleetSeen  []string
	issued     int
	valid      map[string]bool
	writes     []string // credential of each accepted write
	authStatus []int    // statuses /authorize returns first, in order
	lifetime   int64    // expires_in_seconds
	noAuthz    bool     // no /authorize endpoint (404)
	refuse     bool     // every write is 401
}

func newAuthReceiver(t *testing.T) *authReceiver {
	t.Helper()
	ar := &authReceiver{valid: map[string]bool{}, lifetime: 3600}
	ar.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ar.mu.Lock()
		defer ar.mu.Unlock()
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch r.URL.Path {
		case "/authorize":
			if ar.noAuthz {
				http.NotFound(w, r)
				return
			}
			ar.fleetSeen = append(ar.fleetSeen, tok)
			ar.ids = append(ar.ids, r.FormValue("id"))
			if len(ar.authStatus) > 0 {
				code := ar.authStatus[0]
				ar.authStatus = ar.authStatus[1:]
				http.Error(w, "fake", code)
				return
			}
			if tok != "fleet-token" {
				http.Error(w, "unknown fleet token", http.StatusUnauthorized)
				return
			}
			ar.issued++
			cred := fmt.Sprintf("cred-%d", ar.issued)
			ar.valid[cred] = true
			_ = json.NewEncoder(w).Encode(map[string]any{"token": cred, "expires_in_seconds": ar.lifetime})
		case "/api/v1/write":
			if ar.refuse || (!ar.valid[tok] && (!ar.noAuthz || tok != "fleet-token")) {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			ar.writes = append(ar.writes, tok)
			w.Header().Set("X-Prometheus-Remote-Write-Samples-Written", "1") // oneWrite's sample
			w.WriteHeader(http.StatusNoContent)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ar.srv.Close)
	return ar
}

func (ar *authReceiver) revokeAll() {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	clear(ar.valid)
}

func (ar *authReceiver) snapshot() (issued int, writes []string, ids []string) {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.issued, append([]string(nil), ar.writes...), append([]string(nil), ar.ids...)
}

func fleetTokenFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(p, []byte("fleet-token\n"), 0o600))
	return p
}

func newTestAuthorizer(t *testing.T, ar *authReceiver, reg prometheus.Registerer, opts AuthorizerOptions) *Authorizer {
	t.Helper()
	if opts.TokenFile == "" {
		opts.TokenFile = fleetTokenFile(t)
	}
	if opts.ClusterID == "" {
		opts.ClusterID = hashedID
	}
	opts.MinBackoff, opts.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	return NewAuthorizer(discardLogger(), reg, mustURL(t, ar.srv.URL), http.DefaultClient, opts)
}

func oneWrite(t *testing.T) []byte {
	t.Helper()
	b, err := EncodeWriteRequest(&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels: []prompb.Label{{Name: "__name__", Value: "up"}}, Samples: []prompb.Sample{{Value: 1, Timestamp: 1}},
	}}})
	require.NoError(t, err)
	return b
}

func TestAuthorizerExchangesHashedIDAndWritesWithCredential(t *testing.T) {
	ar := newAuthReceiver(t)
	reg := prometheus.NewRegistry()
	a := newTestAuthorizer(t, ar, reg, AuthorizerOptions{})
	s := NewHTTPSender(mustURL(t, ar.srv.URL), http.DefaultClient, HTTPSenderOptions{Credentials: a})
	require.NoError(t, s.SendEncoded(context.Background(), oneWrite(t)))
	require.NoError(t, s.SendEncoded(context.Background(), oneWrite(t)))
	issued, writes, ids := ar.snapshot()
	require.Equal(t, 1, issued, "one exchange serves many writes")
	require.Equal(t, []string{"cred-1", "cred-1"}, writes)
	require.Equal(t, []string{hashedID}, ids, "the hashed id, never the raw one")
	require.NotContains(t, ids, fixtureID)
	require.Equal(t, 1.0, testutil.ToFloat64(a.requests.WithLabelValues("success")))
	require.Greater(t, testutil.ToFloat64(a.expiry), float64(time.Now().Unix()))
}

func TestAuthorizerReauthorizesOnceOn401(t *testing.T) {
	ar := newAuthReceiver(t)
	a := newTestAuthorizer(t, ar, nil, AuthorizerOptions{})
	s := NewHTTPSender(mustURL(t, ar.srv.URL), http.DefaultClient, HTTPSenderOptions{Credentials: a})
	require.NoError(t, s.SendEncoded(context.Background(), oneWrite(t)))
	ar.revokeAll() // e.g. the receiver's signing key rotated
	require.NoError(t, s.SendEncoded(context.Background(), oneWrite(t)), "the batch is retried with a fresh credential")
	issued, writes, _ := ar.snapshot()
	require.Equal(t, 2, issued)
	require.Equal(t, []string{"cred-1", "cred-2"}, writes)
	require.Equal(t, 1.0, testutil.ToFloat64(a.rejected))
}

func TestAuthorizerRejectedTwiceIsRetryable(t *testing.T) {
	ar := newAuthReceiver(t)
	a := newTestAuthorizer(t, ar, nil, AuthorizerOptions{})
	s := NewHTTPSender(mustURL(t, ar.srv.URL), http.DefaultClient, HTTPSenderOptions{Credentials: a})
	ar.mu.Lock()
	ar.refuse = true // every credential is refused at write time
	ar.mu.Unlock()
	err := s.SendEncoded(context.Background(), oneWrite(t))
	var re RetryableError
	require.ErrorAs(t, err, &re, "kept queued, not dropped: %v", err)
	issued, writes, _ := ar.snapshot()
	require.Equal(t, 2, issued, "re-authorized exactly once")
	require.Empty(t, writes)
}

func TestAuthorizerFailureIsRetryableAndKeepsQueuedData(t *testing.T) {
	ar := newAuthReceiver(t)
	ar.authStatus = []int{http.StatusServiceUnavailable, http.StatusUnauthorized, http.StatusInternalServerError}
	a := newTestAuthorizer(t, ar, nil, AuthorizerOptions{})
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	reg := prometheus.NewRegistry()
	q, err := OpenQueue(t.TempDir(), discardLogger(), reg, QueueOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	policy := fixturePolicy(t)
	src := NewFederator(mustURL(t, prom.URL), http.DefaultClient, FederateOptions{Matches: policy.Allow.Selectors()})
	sender := NewHTTPSender(mustURL(t, ar.srv.URL), http.DefaultClient, HTTPSenderOptions{Credentials: a})
	f := New(discardLogger(), reg, src, policy, q, sender, Options{
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
	})
	require.NoError(t, f.Collect(context.Background()))
	n, _ := q.Len()
	require.Positive(t, n)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	draining := make(chan struct{})
	go func() { defer close(done); f.sendLoop(ctx, draining) }()
	close(draining)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatal("queue not delivered")
	}
	cancel()
	issued, writes, _ := ar.snapshot()
	require.Equal(t, 1, issued)
	require.Len(t, writes, n, "every queued request delivered after authorize recovered")
	require.Zero(t, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonHTTP4xx)))
	require.Equal(t, 3.0, testutil.ToFloat64(f.m.retries))
	require.Equal(t, 1.0, testutil.ToFloat64(a.requests.WithLabelValues("unauthorized")))
	require.Equal(t, 2.0, testutil.ToFloat64(a.requests.WithLabelValues("unavailable")))
}

func TestAuthorizerRenewsBeforeExpiry(t *testing.T) {
	ar := newAuthReceiver(t)
	ar.lifetime = 4 // seconds
	a := newTestAuthorizer(t, ar, nil, AuthorizerOptions{RenewAt: 0.3, Jitter: 0.05})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	eventually(t, func() bool { i, _, _ := ar.snapshot(); return i >= 1 }, "exchange at start")
	tok1, err := a.Token(ctx)
	require.NoError(t, err)
	// Renewal is scheduled at ~30% of the 4s lifetime (±5%), long before
	// it expires: the schedule, not the wall clock, so load cannot fail it.
	a.mu.Lock()
	c := a.cur
	a.mu.Unlock()
	require.NotNil(t, c)
	require.GreaterOrEqual(t, c.expires.Sub(c.renewAt), 2*time.Second)
	eventually(t, func() bool { i, _, _ := ar.snapshot(); return i >= 3 }, "two renewals")
	tok2, err := a.Token(ctx)
	require.NoError(t, err)
	require.NotEqual(t, tok1, tok2)
}

// TestAuthorizerHugeLifetimeIsLong: a lifetime beyond what a Duration
// holds (a receiver meaning "does not expire") is a long one. It used to
// wrap around to an expired credential: every write and every turn of Run
// exchanged again at once, a tight loop of /authorize requests.
func TestAuthorizerHugeLifetimeIsLong(t *testing.T) {
	for _, secs := range []int64{9223372037, 18446744074} {
		ar := newAuthReceiver(t)
		ar.lifetime = secs
		a := newTestAuthorizer(t, ar, nil, AuthorizerOptions{})
		tok, err := a.Token(context.Background())
		require.NoError(t, err, "expires_in_seconds %d", secs)
		a.mu.Lock()
		c := a.cur
		a.mu.Unlock()
		require.Equal(t, c.token, tok)
		require.Greater(t, time.Until(c.renewAt), 24*time.Hour, "expires_in_seconds %d: renewed at once", secs)
	}
}

func TestAuthorizerRunRetriesFailedExchange(t *testing.T) {
	ar := newAuthReceiver(t)
	ar.authStatus = []int{http.StatusBadGateway, http.StatusBadGateway}
	a := newTestAuthorizer(t, ar, nil, AuthorizerOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	eventually(t, func() bool { i, _, _ := ar.snapshot(); return i == 1 }, "exchange succeeds after retries")
	_, _, ids := ar.snapshot()
	require.Len(t, ids, 3)
}

// While Run waits out its backoff after a failed exchange, the write
// path does not exchange on its own: it is told to retry when Run does, so
// a fleet's /authorize load while the receiver is down is Run's backoff
// alone. A rejected credential (reprobe) lets it ask at once again.
func TestAuthorizerTokenWaitsForRunsRetry(t *testing.T) {
	ar := newAuthReceiver(t)
	ar.authStatus = []int{http.StatusBadGateway, http.StatusBadGateway}
	a := newTestAuthorizer(t, ar, nil, AuthorizerOptions{})
	a.opts.MinBackoff, a.opts.MaxBackoff = time.Hour, time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	eventually(t, func() bool { wait, _ := a.backingOff(); return wait > 0 }, "Run's first exchange failed")

	for range 3 {
		_, err := a.Token(context.Background())
		var re RetryableError
		require.ErrorAs(t, err, &re)
		require.Greater(t, re.RetryAfter, 29*time.Minute, "retry when Run does (half of 1h at least)")
		require.ErrorContains(t, err, "502")
	}
	_, _, ids := ar.snapshot()
	require.Len(t, ids, 1, "Run's exchange only")

	a.reprobe()
	_, err := a.Token(context.Background())
	require.Error(t, err, "the second 502")
	_, _, ids = ar.snapshot()
	require.Len(t, ids, 2, "asked again after a reprobe")
}

// A write path that asks for a token while Run's exchange is on its way
// waits for it, and takes its failure (and its retry) instead of
// exchanging once more as soon as Run's has failed.
func TestAuthorizerTokenDuringRunsFailingExchange(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if requests.Add(1) == 1 {
			close(entered)
			<-release
		}
		http.Error(w, "down", http.StatusBadGateway)
	}))
	defer srv.Close()
	a := NewAuthorizer(discardLogger(), nil, mustURL(t, srv.URL), srv.Client(), AuthorizerOptions{
		Mode: AuthorizeAlways, Token: "fleet-token", ClusterID: hashedID, MinBackoff: time.Hour, MaxBackoff: time.Hour,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	<-entered
	waiting := make(chan struct{})
	a.waitingForExchange = func() { close(waiting) }
	tokErr := make(chan error, 1)
	go func() { _, err := a.Token(context.Background()); tokErr <- err }()
	<-waiting // Token waits on Run's exchange
	close(release)

	err := <-tokErr
	var re RetryableError
	require.ErrorAs(t, err, &re)
	require.Greater(t, re.RetryAfter, 29*time.Minute, "retry when Run does")
	require.ErrorContains(t, err, "502")
	require.Equal(t, int32(1), requests.Load(), "Run's exchange only")
}

func TestAuthorizerAutoFallsBackWithoutEndpoint(t *testing.T) {
	ar := newAuthReceiver(t)
	ar.noAuthz = true
	a := newTestAuthorizer(t, ar, nil, AuthorizerOptions{Mode: AuthorizeAuto})
	s := NewHTTPSender(mustURL(t, ar.srv.URL), http.DefaultClient, HTTPSenderOptions{Credentials: a})
	require.NoError(t, s.SendEncoded(context.Background(), oneWrite(t)))
	_, writes, _ := ar.snapshot()
	require.Equal(t, []string{"fleet-token"}, writes)
	require.Equal(t, 1.0, testutil.ToFloat64(a.requests.WithLabelValues("not_found")))

	// always: a receiver without /authorize is an error, and retryable.
	b := newTestAuthorizer(t, ar, nil, AuthorizerOptions{Mode: AuthorizeAlways})
	s = NewHTTPSender(mustURL(t, ar.srv.URL), http.DefaultClient, HTTPSenderOptions{Credentials: b})
	err := s.SendEncoded(context.Background(), oneWrite(t))
	var re RetryableError
	require.ErrorAs(t, err, &re)
	require.True(t, errors.Is(err, ErrAuthorize), "%v", err)
}

func TestStaticTokenDoesNotRetry401(t *testing.T) {
	ar := newAuthReceiver(t)
	s := NewHTTPSender(mustURL(t, ar.srv.URL), http.DefaultClient, HTTPSenderOptions{TokenFile: fleetTokenFile(t)})
	err := s.SendEncoded(context.Background(), oneWrite(t))
	var he *HTTPError
	require.ErrorAs(t, err, &he)
	require.Equal(t, http.StatusUnauthorized, he.Code)
	var re RetryableError
	require.False(t, errors.As(err, &re), "a static token's 401 keeps the existing (drop) semantics")
}

// TestInlineStaticTokenDoesNotRetry401: --to-token (StaticToken) is as
// static as --to-token-file: a 401 is a rejection, not retried forever.
func TestInlineStaticTokenDoesNotRetry401(t *testing.T) {
	ar := newAuthReceiver(t)
	s := NewHTTPSender(mustURL(t, ar.srv.URL), http.DefaultClient, HTTPSenderOptions{Credentials: StaticToken("fleet-token")})
	err := s.SendEncoded(context.Background(), oneWrite(t))
	var he *HTTPError
	require.ErrorAs(t, err, &he)
	require.Equal(t, http.StatusUnauthorized, he.Code)
	var re RetryableError
	require.False(t, errors.As(err, &re), "a static token's 401 is retried")
}

// fakeCredentials counts rejections.
type fakeCredentials struct{ rejected int }

func (f *fakeCredentials) Token(context.Context) (string, error) { return "fleet-token", nil }
func (f *fakeCredentials) Rejected(string) bool                  { f.rejected++; return true }

func TestForbiddenWithExchangedCredentialsKeepsData(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "forbidden: this credential may not write", http.StatusForbidden)
	}))
	defer srv.Close()
	creds := &fakeCredentials{}
	s := NewHTTPSender(mustURL(t, srv.URL), http.DefaultClient, HTTPSenderOptions{Credentials: creds})
	err := s.SendEncoded(context.Background(), oneWrite(t))
	var re RetryableError
	require.ErrorAs(t, err, &re, "a 403 with exchanged credentials keeps the batch queued: %v", err)
	require.Equal(t, 1, creds.rejected, "and makes the authorizer probe /authorize again")
}

// TestAuthorizeRetryAfterHoldsEveryExchange: a receiver shedding load answers
// /authorize with 429 and Retry-After; neither Run nor the write path asks
// again before it ends, and the write path's retry waits as long.
func TestAuthorizeRetryAfterHoldsEveryExchange(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/authorize" {
			hits.Add(1)
			w.Header().Set("Retry-After", "600")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	a := NewAuthorizer(discardLogger(), nil, mustURL(t, srv.URL), http.DefaultClient, AuthorizerOptions{
		Mode: AuthorizeAlways, TokenFile: fleetTokenFile(t), ClusterID: hashedID,
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	s := NewHTTPSender(mustURL(t, srv.URL), http.DefaultClient, HTTPSenderOptions{Credentials: a})
	var re RetryableError
	for range 20 {
		err := s.SendEncoded(ctx, oneWrite(t))
		require.ErrorAs(t, err, &re)
	}
	require.Greater(t, re.RetryAfter, 9*time.Minute, "the write path's retry ignores the Retry-After")
	a.Rejected("none") // kicks Run
	<-done
	require.Equal(t, int64(1), hits.Load(), "/authorize asked again within its Retry-After")
}
