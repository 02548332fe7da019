package gathering

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func writeDef(t *testing.T, path, yaml string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
}

func newTestServer(t *testing.T, yaml string, grace time.Duration) (*Server, string, *int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gathering.yaml")
	writeDef(t, path, yaml)
	changes := new(int)
	s, err := NewServer(discard(), prometheus.NewRegistry(), Files{Default: path}, ServerOptions{GracePeriod: grace, OnChange: func() { *changes++ }})
	require.NoError(t, err)
	return s, path, changes
}

func get(t *testing.T, h http.Handler, inm string) *httptest.ResponseRecorder {
	t.Helper()
	return getAs(t, h, "acme", inm)
}

// getAs is get by a caller of tenant.
func getAs(t *testing.T, h http.Handler, tenant, inm string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/api/v1/gathering", nil)
	r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: tenant}))
	if inm != "" {
		r.Header.Set("If-None-Match", inm)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestServerETagAnd304(t *testing.T) {
	s, _, _ := newTestServer(t, "version: v1\nselectors: [up]\n", 0)
	w := get(t, s, "")
	require.Equal(t, http.StatusOK, w.Code)
	etag := w.Header().Get("ETag")
	require.Regexp(t, `^"[0-9a-f]{32}"$`, etag, "strong ETag")
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	d, err := Decode(w.Body.Bytes())
	require.NoError(t, err)
	require.Equal(t, "v1", d.Version)

	for _, inm := range []string{etag, `"other", ` + etag, "W/" + etag, "*"} {
		w = get(t, s, inm)
		require.Equal(t, http.StatusNotModified, w.Code, inm)
		require.Zero(t, w.Body.Len(), "304 has no body")
		require.Equal(t, etag, w.Header().Get("ETag"))
	}
	require.Equal(t, http.StatusOK, get(t, s, `"stale"`).Code)
	require.Equal(t, 4.0, testutil.ToFloat64(s.requests.WithLabelValues("304")))
}

func TestServerReloadKeepsLastGoodAndGrace(t *testing.T) {
	s, path, changes := newTestServer(t, "version: v1\nselectors: [up]\n", time.Hour)
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	etag1 := s.Current("acme").ETag

	// Unchanged file: nothing happens.
	require.NoError(t, s.Reload())
	require.Zero(t, *changes)

	// Invalid: logged, counted, the previous one stays.
	writeDef(t, path, "version: v2\nselectors: ['up{']\n")
	require.ErrorContains(t, s.Reload(), path)
	require.Equal(t, etag1, s.Current("acme").ETag)
	require.Equal(t, 1.0, testutil.ToFloat64(s.reloads.WithLabelValues(DefaultTenant, "failure")))
	require.Zero(t, *changes)
	writeDef(t, path, "version: v2\nselectors: [up]\nunknown: 1\n")
	require.ErrorContains(t, s.Reload(), "unknown")
	require.Equal(t, 2.0, testutil.ToFloat64(s.reloads.WithLabelValues(DefaultTenant, "failure")))

	// Valid change: served at once, previous selectors accepted for the grace period.
	writeDef(t, path, "version: v2\nselectors: [up, node_info]\nanonymize_labels: [node]\n")
	require.NoError(t, s.Reload())
	require.Equal(t, 1, *changes)
	require.Equal(t, "v2", s.Current("acme").Def.Version)
	require.NotEqual(t, etag1, s.Current("acme").ETag)
	require.Equal(t, http.StatusOK, get(t, s, etag1).Code, "the old ETag no longer matches")
	def, _ := s.Allowlists()
	require.True(t, def.Cur.Allows(labels.FromStrings("__name__", "node_info")))
	require.Len(t, def.Prev, 1)
	require.Equal(t, now.Add(time.Hour), def.Prev[0].Until)
	require.Equal(t, 1.0, testutil.ToFloat64(s.info.WithLabelValues(DefaultTenant, "v2", s.Current("acme").ETag)))

	// Same content reformatted: no change.
	writeDef(t, path, "# comment\nversion: v2\nselectors:\n  - up\n  - node_info\nanonymize_labels: [node]\n")
	require.NoError(t, s.Reload())
	require.Equal(t, 1, *changes)
}

func TestNewServerRefusesInvalid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g.yaml")
	writeDef(t, path, "version: v1\nselectors: []\n")
	_, err := NewServer(discard(), nil, Files{Default: path}, ServerOptions{})
	require.ErrorContains(t, err, "at least one")
	_, err = NewServer(discard(), nil, Files{Tenants: map[string]string{"a": filepath.Join(t.TempDir(), "missing.yaml")}}, ServerOptions{})
	require.Error(t, err)
}

func TestServerHEAD(t *testing.T) {
	s, _, _ := newTestServer(t, "version: v1\nselectors: [up]\n", 0)
	r := httptest.NewRequest(http.MethodHead, "/api/v1/gathering", nil)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Body)
	require.Empty(t, b)
	require.Equal(t, http.StatusOK, w.Code)
}
