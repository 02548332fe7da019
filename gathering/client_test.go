package gathering

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// fleet serves whatever body is set, honouring If-None-Match against
// ETag(body), and counts response body bytes written.
type fleet struct {
	mu        sync.Mutex
	body      string
	status    int
	bodyBytes int
	auth      string // required bearer token, if set
	srv       *httptest.Server
}

func newFleet(t *testing.T, body string) *fleet {
	t.Helper()
	fl := &fleet{body: body}
	fl.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		if fl.auth != "" && r.Header.Get("Authorization") != "Bearer "+fl.auth {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if fl.status != 0 {
			http.Error(w, "fake", fl.status)
			return
		}
		etag := ETag([]byte(fl.body))
		w.Header().Set("ETag", etag)
		if etagMatches(r.Header.Get("If-None-Match"), etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		n, _ := w.Write([]byte(fl.body))
		fl.bodyBytes += n
	}))
	t.Cleanup(fl.srv.Close)
	return fl
}

func (fl *fleet) set(body string, status int) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.body, fl.status = body, status
}

func (fl *fleet) served() int {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.bodyBytes
}

type applied struct {
	mu   sync.Mutex
	defs []*Compiled
	fail error
}

func (a *applied) apply(c *Compiled) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail != nil {
		return a.fail
	}
	a.defs = append(a.defs, c)
	return nil
}

func (a *applied) versions() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, c := range a.defs {
		out = append(out, c.Def.Version)
	}
	return out
}

func newTestPoller(t *testing.T, url, cache string, a *applied) *Poller {
	t.Helper()
	return NewPoller(discard(), nil, PollerOptions{
		URL: url, Client: http.DefaultClient, CacheFile: cache, ForwarderVersion: "0.2.0", Apply: a.apply,
	})
}

func TestPollAppliesCachesAnd304CostsNoBody(t *testing.T) {
	fl := newFleet(t, `{"version":"v1","selectors":["up"]}`)
	cache := filepath.Join(t.TempDir(), "cache", "gathering.json")
	a := &applied{}
	p := newTestPoller(t, fl.srv.URL, cache, a)
	ctx := context.Background()

	require.NoError(t, p.Poll(ctx))
	require.Equal(t, []string{"v1"}, a.versions())
	require.Equal(t, 1.0, testutil.ToFloat64(p.info.WithLabelValues("v1", "fleet")))
	require.Positive(t, testutil.ToFloat64(p.lastSuccess))
	servedOnce := fl.served()
	require.Positive(t, servedOnce)
	_, err := os.Stat(cache)
	require.NoError(t, err, "the good definition is cached")

	// Unchanged: 304, no body on the wire, nothing re-applied.
	for range 3 {
		require.NoError(t, p.Poll(ctx))
	}
	require.Equal(t, servedOnce, fl.served(), "304 polls transfer no body")
	require.Equal(t, float64(servedOnce), testutil.ToFloat64(p.bodyBytes))
	require.Equal(t, 3.0, testutil.ToFloat64(p.polls.WithLabelValues("not_modified")))
	require.Equal(t, []string{"v1"}, a.versions())

	// Changed: applied for the next cycle.
	fl.set(`{"version":"v2","selectors":["up","node_info"],"anonymize_labels":["node"]}`, 0)
	require.NoError(t, p.Poll(ctx))
	require.Equal(t, []string{"v1", "v2"}, a.versions())
	require.Equal(t, 1.0, testutil.ToFloat64(p.info.WithLabelValues("v2", "fleet")))
	require.Zero(t, testutil.ToFloat64(p.info.WithLabelValues("v1", "fleet")), "only the version in force is exported")
}

func TestPollFailuresKeepPreviousByReason(t *testing.T) {
	fl := newFleet(t, `{"version":"v1","selectors":["up"]}`)
	a := &applied{}
	p := newTestPoller(t, fl.srv.URL, filepath.Join(t.TempDir(), "g.json"), a)
	ctx := context.Background()
	require.NoError(t, p.Poll(ctx))

	for _, tc := range []struct {
		body   string
		status int
		reason string
	}{
		{`{"version":"v2","selectors":["up{"]}`, 0, ReasonInvalid},
		{`{"version":"v2","selectors":["up"],"run":"x"}`, 0, ReasonMalformed},
		{`not json`, 0, ReasonMalformed},
		{`{"version":"v2","selectors":["up"],"min_forwarder_version":"9.0.0"}`, 0, ReasonTooOld},
		{``, http.StatusInternalServerError, ReasonHTTP},
		{``, http.StatusForbidden, ReasonUnauthorized},
	} {
		fl.set(tc.body, tc.status)
		before := testutil.ToFloat64(p.failures.WithLabelValues(tc.reason))
		err := p.Poll(ctx)
		require.Error(t, err, tc.reason)
		require.Equal(t, before+1, testutil.ToFloat64(p.failures.WithLabelValues(tc.reason)), tc.reason)
		require.Equal(t, []string{"v1"}, a.versions(), "the previous definition stays")
		require.Equal(t, 1.0, testutil.ToFloat64(p.info.WithLabelValues("v1", "fleet")))
	}
	require.Equal(t, 2.0, testutil.ToFloat64(p.failures.WithLabelValues(ReasonMalformed)))

	// Apply refuses (e.g. relabel rules reject it): counted as apply.
	fl.set(`{"version":"v3","selectors":["up"]}`, 0)
	a.fail = errors.New("nope")
	require.Error(t, p.Poll(ctx))
	require.Equal(t, 1.0, testutil.ToFloat64(p.failures.WithLabelValues(ReasonApply)))

	// Unreachable.
	fl.srv.Close()
	require.Error(t, p.Poll(ctx))
	require.Equal(t, 1.0, testutil.ToFloat64(p.failures.WithLabelValues(ReasonUnreachable)))
	require.Equal(t, 8.0, testutil.ToFloat64(p.polls.WithLabelValues("failed")))
}

func TestPollTooLarge(t *testing.T) {
	big := `{"version":"v1","selectors":["` + string(make([]byte, MaxBytes)) + `"]}`
	fl := newFleet(t, big)
	a := &applied{}
	p := newTestPoller(t, fl.srv.URL, "", a)
	require.Error(t, p.Poll(context.Background()))
	require.Equal(t, 1.0, testutil.ToFloat64(p.failures.WithLabelValues(ReasonTooLarge)))
	require.Empty(t, a.versions())
}

func TestLoadCacheAtStartAndConditionalPoll(t *testing.T) {
	fl := newFleet(t, `{"version":"v1","selectors":["up"]}`)
	cache := filepath.Join(t.TempDir(), "g.json")
	a := &applied{}
	require.NoError(t, newTestPoller(t, fl.srv.URL, cache, a).Poll(context.Background()))
	served := fl.served()

	// A restarted forwarder: the cache is applied before any network access,
	// and its ETag makes the first poll a 304.
	b := &applied{}
	p := newTestPoller(t, fl.srv.URL, cache, b)
	c, err := p.LoadCache()
	require.NoError(t, err)
	require.Equal(t, "v1", c.Def.Version)
	require.Equal(t, 1.0, testutil.ToFloat64(p.info.WithLabelValues("v1", "cache")))
	require.NoError(t, p.Poll(context.Background()))
	require.Equal(t, served, fl.served())
	require.Equal(t, []string{"v1"}, b.versions())

	// A corrupt cache is refused whole.
	require.NoError(t, os.WriteFile(cache, []byte(`{"etag":"x","definition":{"version":"v1","selectors":["up{"]}}`), 0o600))
	_, err = newTestPoller(t, fl.srv.URL, cache, &applied{}).LoadCache()
	require.ErrorIs(t, err, ErrInvalid)
	_, err = newTestPoller(t, fl.srv.URL, filepath.Join(t.TempDir(), "none.json"), &applied{}).LoadCache()
	require.Error(t, err)
}

type rotating struct {
	mu       sync.Mutex
	tok      string
	rejected int
}

func (r *rotating) Token(context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tok, nil
}

func (r *rotating) Rejected(string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejected++
	r.tok = "new"
	return true
}

func TestPollReauthorizesOnceOn401(t *testing.T) {
	fl := newFleet(t, `{"version":"v1","selectors":["up"]}`)
	fl.auth = "new"
	creds := &rotating{tok: "old"}
	a := &applied{}
	p := NewPoller(discard(), nil, PollerOptions{URL: fl.srv.URL, Client: http.DefaultClient, Credentials: creds, Apply: a.apply})
	require.NoError(t, p.Poll(context.Background()))
	require.Equal(t, 1, creds.rejected)
	require.Equal(t, []string{"v1"}, a.versions())
}

// Zero options mean the documented defaults, never "no jitter" (issue 20);
// a negative jitter is the explicit off.
func TestPollerJitterDefaults(t *testing.T) {
	require.Equal(t, 0.1, NewPoller(discard(), nil, PollerOptions{}).opts.Jitter)
	require.Equal(t, 0.1, NewPoller(discard(), nil, PollerOptions{Jitter: 1}).opts.Jitter)
	require.Equal(t, 0.3, NewPoller(discard(), nil, PollerOptions{Jitter: 0.3}).opts.Jitter)
	require.Equal(t, -1.0, NewPoller(discard(), nil, PollerOptions{Jitter: -1}).opts.Jitter)
}

func TestReapplyUsesTheDefinitionInForceElseLocal(t *testing.T) {
	fl := newFleet(t, `{"version":"v1","selectors":["up"]}`)
	a := &applied{}
	p := newTestPoller(t, fl.srv.URL, "", a)
	locals := 0
	local := func() (bool, error) { locals++; return true, nil }

	// No definition yet: the local selectors are put in force.
	p.UseLocal()
	require.NoError(t, p.Reapply(a.apply, local))
	require.Equal(t, 1, locals)
	require.Empty(t, a.versions())
	require.Equal(t, 1.0, testutil.ToFloat64(p.info.WithLabelValues("local", "local")))

	// A definition from the fleet is in force: it is applied again, not the local selectors.
	require.NoError(t, p.Poll(context.Background()))
	require.NoError(t, p.Reapply(a.apply, local))
	require.Equal(t, []string{"v1", "v1"}, a.versions())
	require.Equal(t, 1, locals)
	require.Equal(t, 1.0, testutil.ToFloat64(p.info.WithLabelValues("v1", "fleet")))

	// An Apply error is returned; what is in force stays.
	a.fail = errors.New("bad rules")
	require.ErrorContains(t, p.Reapply(a.apply, local), "bad rules")
	require.Equal(t, 1.0, testutil.ToFloat64(p.info.WithLabelValues("v1", "fleet")))
}

// TestReapplyDoesNotWaitForAFetch: a poll holds the state only to apply
// what it fetched, so a reload's Reapply goes through while a fetch waits on
// a slow receiver, and the poll then applies its definition as usual.
func TestReapplyDoesNotWaitForAFetch(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = w.Write([]byte(`{"version":"v1","selectors":["up"]}`))
	}))
	defer srv.Close()
	a := &applied{}
	p := newTestPoller(t, srv.URL, "", a)
	p.UseLocal()
	polled := make(chan error, 1)
	go func() { polled <- p.Poll(context.Background()) }()
	<-entered

	reapplied := make(chan error, 1)
	go func() { reapplied <- p.Reapply(a.apply, func() (bool, error) { return true, nil }) }()
	select {
	case err := <-reapplied:
		require.NoError(t, err)
	case <-time.After(30 * time.Second): // the fetch never ends until released
		close(release)
		t.Fatal("Reapply waited for the poll's fetch")
	}
	close(release)
	require.NoError(t, <-polled)
	require.Equal(t, []string{"v1"}, a.versions())
}
