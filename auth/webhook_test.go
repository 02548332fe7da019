package auth

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWebhookAnswers: the upstream's answer maps to a tenant, a refusal of
// the token (401) or the cluster (403), or ErrUpstream for anything else,
// including an answer without a valid tenant.
func TestWebhookAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Token, ClusterID string }
		require.NoError(t, json.NewDecoder(r.Body).Decode(&struct {
			Token     *string `json:"token"`
			ClusterID *string `json:"cluster_id"`
		}{&in.Token, &in.ClusterID}))
		switch in.Token {
		case "good":
			_, _ = w.Write([]byte(`{"tenant":"acme"}`))
		case "bad-tenant":
			_, _ = w.Write([]byte(`{"tenant":"no/slashes"}`))
		case "revoked":
			w.WriteHeader(http.StatusUnauthorized)
		case "wrong-cluster":
			w.WriteHeader(http.StatusForbidden)
		default:
			w.WriteHeader(http.StatusBadGateway)
		}
	}))
	defer srv.Close()
	wh := NewWebhook(srv.URL, srv.Client())
	tenant, err := wh.AuthorizeFleet(context.Background(), "good", unhashed("c1"))
	require.NoError(t, err)
	require.Equal(t, "acme", tenant)
	for token, want := range map[string]error{"bad-tenant": ErrUpstream, "revoked": ErrUnauthorized, "wrong-cluster": ErrForbidden, "other": ErrUpstream} {
		_, err := wh.AuthorizeFleet(context.Background(), token, unhashed("c1"))
		require.ErrorIs(t, err, want, token)
	}

	tenant, err = Webhook{URL: srv.URL}.AuthorizeFleet(context.Background(), "good", unhashed("c1"))
	require.NoError(t, err, "a Webhook without a Client uses http.DefaultClient")
	require.Equal(t, "acme", tenant)
}

// TestWebhookBoundsLookupsInFlight: past WebhookMaxInflight lookups waiting
// for the upstream, another fails at once (ErrUpstream: 503, retry later)
// rather than holding one more goroutine and upstream request.
func TestWebhookBoundsLookupsInFlight(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, WebhookMaxInflight)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		_, _ = w.Write([]byte(`{"tenant":"acme"}`))
	}))
	defer srv.Close()
	defer close(release)
	wh := NewWebhook(srv.URL, &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0}})
	done := make(chan error, WebhookMaxInflight)
	for range WebhookMaxInflight {
		go func() {
			_, err := wh.AuthorizeFleet(context.Background(), "good", unhashed("c1"))
			done <- err
		}()
	}
	for range WebhookMaxInflight {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the lookups did not reach the upstream")
		}
	}
	refused := make(chan error, 1)
	go func() {
		_, err := wh.AuthorizeFleet(context.Background(), "good", unhashed("c1"))
		refused <- err
	}()
	select {
	case err := <-refused:
		require.ErrorIs(t, err, ErrUpstream)
	case <-time.After(time.Minute): // the upstream holds every lookup until released
		t.Fatal("it waited for the upstream")
	}

	release <- struct{}{} // one lookup ends: room for another
	require.NoError(t, <-done)
}

// TestTelemeterBearerOverWebhook: on Telemeter's write path a webhook's
// refusal (401/403) is cached, so a bearer sent again costs no lookup, and
// its failure (5xx) is not. With the webhook at its lookup cap, a bearer
// with a cached answer is still served; only uncached ones get 503.
func TestTelemeterBearerOverWebhook(t *testing.T) {
	var (
		mu      sync.Mutex
		hits    = map[string]int{}
		entered = make(chan struct{}, WebhookMaxInflight)
		release = make(chan struct{})
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Token string `json:"token"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		mu.Lock()
		hits[in.Token]++
		mu.Unlock()
		switch {
		case in.Token == "fleet":
			_, _ = w.Write([]byte(`{"tenant":"acme"}`))
		case in.Token == "flaky":
			w.WriteHeader(http.StatusBadGateway)
		case strings.HasPrefix(in.Token, "slow"):
			entered <- struct{}{}
			<-release
			w.WriteHeader(http.StatusUnauthorized)
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	defer srv.Close()
	h := Middleware(NewTelemeterBearer(nil, NewWebhook(srv.URL, srv.Client()), TelemeterOptions{}), PermWrite, nil,
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	serve := func(token, clusterID string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, bearerReq(telemeterBearer(token, clusterID)))
		return rec.Code
	}
	hitsOf := func(token string) int {
		mu.Lock()
		defer mu.Unlock()
		return hits[token]
	}

	require.Equal(t, http.StatusUnauthorized, serve("made-up", "c1"))
	require.Equal(t, http.StatusUnauthorized, serve("made-up", "c1"))
	require.Equal(t, 1, hitsOf("made-up"), "the refusal is cached")
	require.Equal(t, http.StatusServiceUnavailable, serve("flaky", "c1"))
	require.Equal(t, http.StatusServiceUnavailable, serve("flaky", "c1"))
	require.Equal(t, 2, hitsOf("flaky"), "a failure is not")
	require.Equal(t, http.StatusNoContent, serve("fleet", "c1"))

	codes := make(chan int, WebhookMaxInflight)
	for i := range WebhookMaxInflight {
		go func() { codes <- serve(fmt.Sprint("slow-", i), "c1") }()
	}
	for range WebhookMaxInflight {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the lookups did not reach the webhook")
		}
	}
	require.Equal(t, http.StatusNoContent, serve("fleet", "c1"), "a cached answer needs no lookup slot")
	require.Equal(t, http.StatusServiceUnavailable, serve("fleet", "c2"), "an uncached one does")
	close(release)
	for range WebhookMaxInflight {
		require.Equal(t, http.StatusUnauthorized, <-codes)
	}
	require.Equal(t, 1, hitsOf("fleet"))
}

// TestWebhookFollowsNoRedirect: a webhook answering with a redirect does
// not get the fleet token sent wherever it points; the answer is
// ErrUpstream, as any other unexpected status.
func TestWebhookFollowsNoRedirect(t *testing.T) {
	var reached atomic.Bool
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached.Store(true)
		_, _ = w.Write([]byte(`{"tenant":"acme"}`))
	}))
	defer elsewhere.Close()
	redirecting := httptest.NewServer(http.RedirectHandler(elsewhere.URL, http.StatusTemporaryRedirect))
	defer redirecting.Close()

	for name, wh := range map[string]Webhook{
		"NewWebhook":     NewWebhook(redirecting.URL, redirecting.Client()),
		"without Client": {URL: redirecting.URL},
	} {
		_, err := wh.AuthorizeFleet(context.Background(), "good", unhashed("c1"))
		require.ErrorIs(t, err, ErrUpstream, name)
	}
	require.False(t, reached.Load(), "the token was sent to the redirect's target")
}
