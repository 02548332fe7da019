package erasure

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// A body over the limit is 413 naming the limit, not a decode error of
// the truncated JSON.
func TestOversizedRequestIs413(t *testing.T) {
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, filepath.Join(t.TempDir(), "jobs"), Options{})
	require.NoError(t, err)
	h := auth.Middleware(auth.Insecure{Tenant: "acme"}, 0, nil, e.Handler(nil))
	body := `{"cluster_id":"x","requested_by":"` + strings.Repeat("a", maxRequestBytes) + `"}`
	for _, path := range []string{erasePath, readmitPath} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, path)
		require.Contains(t, rec.Body.String(), "request body exceeds the limit of 65536 bytes", path)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, erasePath, strings.NewReader(`{"cluster_id":"x"}`)))
	require.Equal(t, http.StatusAccepted, rec.Code, "a small request still passes")
}

// Patterns names routes Handler serves; a method it does not name (PUT of
// the erase path) is not served.
func TestPatternsAreHandlersRoutes(t *testing.T) {
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, filepath.Join(t.TempDir(), "jobs"), Options{})
	require.NoError(t, err)
	h := auth.Middleware(auth.Insecure{Tenant: "acme"}, 0, nil, e.Handler(nil))
	for _, p := range Patterns {
		method, path, _ := strings.Cut(p, " ")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, strings.Replace(path, "{id}", "unknown", 1), strings.NewReader(`{"cluster_id":"x"}`)))
		require.NotEqual(t, http.StatusMethodNotAllowed, rec.Code, p)
		require.NotContains(t, rec.Body.String(), "404 page not found", p)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, erasePath, nil))
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code, "a route not in Patterns")
}

// The body is JSON, as docs/lifecycle.md says: another Content-Type is
// 415, none or application/json with a charset passes, and malformed JSON
// is 400.
func TestRequestBodyIsJSON(t *testing.T) {
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, filepath.Join(t.TempDir(), "jobs"), Options{})
	require.NoError(t, err)
	h := auth.Middleware(auth.Insecure{Tenant: "acme"}, 0, nil, e.Handler(nil))
	for _, tc := range []struct {
		contentType, body string
		code              int
	}{
		{"text/plain", `{"cluster_id":"x"}`, http.StatusUnsupportedMediaType},
		{"application/x-www-form-urlencoded", `cluster_id=x`, http.StatusUnsupportedMediaType},
		{"application/json; charset=utf-8", `{"cluster_id":"x"}`, http.StatusAccepted},
		{"", `{"cluster_id":"x"`, http.StatusBadRequest},
	} {
		req := httptest.NewRequest(http.MethodPost, erasePath, strings.NewReader(tc.body))
		if tc.contentType != "" {
			req.Header.Set("Content-Type", tc.contentType)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, tc.code, rec.Code, "%q %s: %s", tc.contentType, tc.body, rec.Body)
	}
}
