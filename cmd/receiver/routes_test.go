package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// A method a path is not routed for is 405 with Allow before any handler
// runs, also when a method-less catch-all (an authenticated API) would
// take the path; the catch-all keeps what it serves, and a pattern with
// the request's method wins as in http.ServeMux.
func TestRouterAnswers405BeforeCatchAlls(t *testing.T) {
	rt := newRouter()
	answer := func(code int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) })
	}
	rt.Handle("POST /api/v1/write", answer(http.StatusNoContent))
	rt.Handle("/api/v1/", answer(http.StatusForbidden)) // authentication of the query API
	rt.Handle("GET /api/v1/admin/erase", answer(http.StatusOK))
	rt.Handle("POST /api/v1/admin/erase", answer(http.StatusAccepted))
	rt.Handle("/api/v1/admin/", answer(http.StatusUnauthorized))
	rt.Handle("PUT /metrics/job/", answer(http.StatusOK))
	rt.Handle("POST /metrics/job/", answer(http.StatusOK))
	rt.Handle("GET /a/{x}", answer(http.StatusOK))
	rt.Handle("POST /a/b", answer(http.StatusCreated))
	rt.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })

	for _, tc := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{"POST", "/api/v1/write", http.StatusNoContent, ""},
		{"GET", "/api/v1/write", http.StatusMethodNotAllowed, "POST"},
		{"DELETE", "/api/v1/write", http.StatusMethodNotAllowed, "POST"},
		{"GET", "/api/v1/query", http.StatusForbidden, ""},
		{"POST", "/api/v1/query", http.StatusForbidden, ""},
		{"HEAD", "/api/v1/admin/erase", http.StatusOK, ""},
		{"PUT", "/api/v1/admin/erase", http.StatusMethodNotAllowed, "GET, HEAD, POST"},
		{"GET", "/api/v1/admin/other", http.StatusUnauthorized, ""},
		{"GET", "/metrics/job/installer", http.StatusMethodNotAllowed, "POST, PUT"},
		{"GET", "/a/b", http.StatusOK, ""}, // GET /a/{x}
		{"POST", "/a/b", http.StatusCreated, ""},
		{"PUT", "/a/b", http.StatusMethodNotAllowed, "GET, HEAD, POST"}, // ServeMux's own 405
		{"GET", "/", http.StatusOK, ""},
		{"POST", "/", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"GET", "/unknown", http.StatusNotFound, ""},
	} {
		rec := httptest.NewRecorder()
		rt.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		require.Equal(t, tc.code, rec.Code, "%s %s: %s", tc.method, tc.path, rec.Body)
		require.Equal(t, tc.allow, rec.Header().Get("Allow"), "%s %s", tc.method, tc.path)
	}
}
