package auth

import (
	"bytes"
	"crypto/ed25519"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWebhookAnswerIsLoggedAsAnAnswer: a webhook that answers 404 (a
// registry's "unknown cluster") gets the client a 503, as documented, but
// the log says what it answered and what to change, not that it is
// unavailable; it names the cluster by its pseudonym, never by its raw id
// or token, and logs at Warn once a minute however many clusters retry.
func TestWebhookAnswerIsLoggedAsAnAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.NotFound(w, nil)
	}))
	defer srv.Close()
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	hasher, err := NewClusterIDHasher([]byte("0123456789abcdef-fleet-key"))
	require.NoError(t, err)
	newHandler := func(hasher *ClusterIDHasher) (*AuthorizeHandler, *fakeClock) {
		iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, nil)
		iss.Hasher = hasher
		h := NewAuthorizeHandler(logger, nil, NewWebhook(srv.URL, srv.Client()), iss)
		clk := newClock()
		h.upstream.now = clk.Now
		return h, clk
	}
	const raw, token = "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f", "fleet-secret-token"
	ask := func(h *AuthorizeHandler) []string {
		t.Helper()
		logs.Reset()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, bearer(httptest.NewRequest(http.MethodPost, "/authorize?id="+raw, nil), token))
		require.Equal(t, http.StatusServiceUnavailable, rec.Code, "the documented mapping stays")
		require.Equal(t, "30", rec.Header().Get("Retry-After"))
		return strings.Split(strings.TrimSpace(logs.String()), "\n")
	}

	h, clk := newHandler(hasher)
	lines := ask(h)
	require.Len(t, lines, 1)
	line := lines[0]
	require.Contains(t, line, "level=WARN")
	require.Contains(t, line, `msg="authorize webhook answered neither 200 nor a refusal (401, 403)"`)
	require.Contains(t, line, `err="webhook answered 404, not 200/401/403"`)
	require.Contains(t, line, "answered=503")
	require.Contains(t, line, "cluster_id="+hasher.Pseudonym(raw))
	require.Contains(t, line, "have the webhook answer 403 for an unknown or refused cluster")
	require.NotContains(t, line, "unavailable")
	require.NotContains(t, line, raw)
	require.NotContains(t, line, token)

	require.Equal(t, []string{""}, ask(h), "another within the minute: not at Warn")
	clk.Advance(upstreamWarnEvery)
	lines = ask(h)
	require.Len(t, lines, 1)
	require.Contains(t, lines[0], "not_logged_before=1", "a minute later, with the count of those not logged")

	h, _ = newHandler(nil) // no cluster_id_hash: the stored id is the raw id
	line = ask(h)[0]
	require.Contains(t, line, "webhook answered 404")
	require.NotContains(t, line, "cluster_id=")
	require.NotContains(t, line, raw)
}

// TestTelemeterWriteLogsTheWebhookAnswer: Telemeter's write path asks the
// same webhook; a 404 is a 503 to the writer, counted, and logged as at
// /authorize (it was only counted), with the pseudonym and never the raw
// id or the token, at Warn once a minute.
func TestTelemeterWriteLogsTheWebhookAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.NotFound(w, nil)
	}))
	defer srv.Close()
	var logs bytes.Buffer
	hasher, err := NewClusterIDHasher([]byte("0123456789abcdef-fleet-key"))
	require.NoError(t, err)
	clk := newClock()
	a := NewTelemeterBearer(nil, NewWebhook(srv.URL, srv.Client()), TelemeterOptions{
		Hasher: hasher,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		now:    clk.Now,
	})
	const raw, token = "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f", "fleet-secret-token"
	write := func() []string {
		t.Helper()
		logs.Reset()
		_, err := a.Authenticate(bearerReq(telemeterBearer(token, raw)))
		require.ErrorIs(t, err, ErrUpstream, "503 to the writer")
		return strings.Split(strings.TrimSpace(logs.String()), "\n")
	}

	lines := write()
	require.Len(t, lines, 1)
	require.Contains(t, lines[0], "level=WARN")
	require.Contains(t, lines[0], `err="webhook answered 404, not 200/401/403"`)
	require.Contains(t, lines[0], "have the webhook answer 403 for an unknown or refused cluster")
	require.Contains(t, lines[0], "cluster_id="+hasher.Pseudonym(raw))
	require.NotContains(t, lines[0], raw)
	require.NotContains(t, lines[0], token)
	require.Equal(t, []string{""}, write(), "another within the minute: not at Warn")
	clk.Advance(upstreamWarnEvery)
	require.Contains(t, write()[0], "not_logged_before=1")
}
