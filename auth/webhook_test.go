package auth

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
	tenant, err := wh.AuthorizeFleet(context.Background(), "good", "c1")
	require.NoError(t, err)
	require.Equal(t, "acme", tenant)
	for token, want := range map[string]error{"bad-tenant": ErrUpstream, "revoked": ErrUnauthorized, "wrong-cluster": ErrForbidden, "other": ErrUpstream} {
		_, err := wh.AuthorizeFleet(context.Background(), token, "c1")
		require.ErrorIs(t, err, want, token)
	}
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
			_, err := wh.AuthorizeFleet(context.Background(), "good", "c1")
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
	start := time.Now()
	_, err := wh.AuthorizeFleet(context.Background(), "good", "c1")
	require.ErrorIs(t, err, ErrUpstream)
	require.Less(t, time.Since(start), time.Second, "it waited for the upstream")

	release <- struct{}{} // one lookup ends: room for another
	require.NoError(t, <-done)
}
