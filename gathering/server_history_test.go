package gathering

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// historyServer opens a Server on files with a fake clock and a state
// directory, as a restart does every time it is called.
type historyServer struct {
	t        *testing.T
	now      time.Time
	stateDir string
	grace    time.Duration
}

func newHistory(t *testing.T) *historyServer {
	return &historyServer{t: t, now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), stateDir: t.TempDir(), grace: time.Hour}
}

func (h *historyServer) open(f Files) *Server {
	h.t.Helper()
	s, err := NewServer(discard(), prometheus.NewRegistry(), f, ServerOptions{
		GracePeriod: h.grace, StateDir: h.stateDir, Now: func() time.Time { return h.now },
	})
	require.NoError(h.t, err)
	return s
}

func tenantAllowlists(s *Server, tenant string) (Allowlists, bool) {
	_, ts := s.Allowlists()
	a, ok := ts[tenant]
	return a, ok
}

// TestServerEveryReplacedVersionKeepsItsGrace: A→B→C within minutes (B a
// typo, say): forwarders still on A are not refused, and each version is
// accepted until its own grace period ends, across restarts.
func TestServerEveryReplacedVersionKeepsItsGrace(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "version: A\nselectors: [a_metric]\n", nil)
	s := h.open(f)
	t0 := h.now

	h.now = t0.Add(time.Minute)
	writeDef(t, f.Default, "version: B\nselectors: [b_typo]\n")
	s.Reload()
	h.now = t0.Add(3 * time.Minute)
	writeDef(t, f.Default, "version: C\nselectors: [a_metric, c_metric]\n")
	s.Reload()
	require.Equal(t, "C", s.Current("x").Def.Version)

	check := func(s *Server, wantA, wantB time.Time) {
		t.Helper()
		def, _ := s.Allowlists()
		require.True(t, def.Cur.AllowsFunc(func(string) string { return "c_metric" }))
		require.Equal(t, wantA, acceptedUntil(*def, "a_metric"), "A")
		require.Equal(t, wantB, acceptedUntil(*def, "b_typo"), "B")
	}
	check(s, t0.Add(time.Minute+time.Hour), t0.Add(3*time.Minute+time.Hour))

	// Restart: the same, each until its own end.
	h.now = t0.Add(30 * time.Minute)
	s = h.open(f)
	check(s, t0.Add(time.Minute+time.Hour), t0.Add(3*time.Minute+time.Hour))

	// A's grace has ended, B's not yet.
	h.now = t0.Add(62 * time.Minute)
	check(s, time.Time{}, t0.Add(3*time.Minute+time.Hour))
	s = h.open(f)
	check(s, time.Time{}, t0.Add(3*time.Minute+time.Hour))

	// Back to B: it is in force, not a previous version; C is one, and so
	// is B's earlier replacement no more.
	h.now = t0.Add(70 * time.Minute)
	writeDef(t, f.Default, "version: B\nselectors: [b_typo]\n")
	s.Reload()
	def, _ := s.Allowlists()
	require.Len(t, def.Prev, 1)
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(*def, "c_metric"))

	// Every grace over: nothing previous, and the state file says so.
	h.now = h.now.Add(time.Hour)
	def, _ = s.Allowlists()
	require.Empty(t, def.Prev)
	s = h.open(f)
	def, _ = s.Allowlists()
	require.Empty(t, def.Prev)
	var ps persistedState
	b, err := os.ReadFile(filepath.Join(h.stateDir, "default.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &ps))
	require.Empty(t, ps.Versions, "versions whose grace ended are not kept")
}

// TestServerPreviousVersionsCapped: past MaxPrevious versions within the
// grace period, the oldest are no longer accepted; the newest are.
func TestServerPreviousVersionsCapped(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "version: v0\nselectors: [m0]\n", nil)
	s := h.open(f)
	const n = MaxPrevious + 3
	for i := 1; i <= n; i++ {
		h.now = h.now.Add(time.Minute)
		writeDef(t, f.Default, fmt.Sprintf("version: v%d\nselectors: [m%d]\n", i, i))
		s.Reload()
	}
	for _, s := range []*Server{s, h.open(f)} { // and after a restart
		def, _ := s.Allowlists()
		require.Len(t, def.Prev, MaxPrevious)
		require.True(t, acceptedUntil(*def, fmt.Sprintf("m%d", n-1)).After(h.now), "the newest replaced")
		require.True(t, acceptedUntil(*def, fmt.Sprintf("m%d", n-MaxPrevious)).After(h.now), "the oldest kept")
		require.True(t, acceptedUntil(*def, fmt.Sprintf("m%d", n-MaxPrevious-1)).IsZero(), "dropped past the cap")
		require.True(t, acceptedUntil(*def, "m0").IsZero())
	}
}

// TestServerReadsSingleStateFormat: a state file written before several
// versions were kept (one "previous" and its "replaced") is restored, and
// rewritten in the new format at the next change.
func TestServerReadsSingleStateFormat(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "", map[string]string{"acme": "version: a2\nselectors: [a_new]\n"})
	body := func(yaml string) string {
		d, err := DecodeYAML([]byte(yaml))
		require.NoError(t, err)
		return string(d.Encode())
	}
	replacedAt := h.now.Add(-10 * time.Minute)
	require.NoError(t, os.MkdirAll(filepath.Join(h.stateDir, "tenants"), 0o750))
	old := fmt.Sprintf(`{"current":%s,"previous":%s,"replaced":%q}`,
		body("version: a2\nselectors: [a_new]\n"), body("version: a1\nselectors: [a_metric]\n"), replacedAt.Format(time.RFC3339Nano))
	require.NoError(t, os.WriteFile(filepath.Join(h.stateDir, "tenants", "acme.json"), []byte(old), 0o600))

	s := h.open(f)
	a, _ := tenantAllowlists(s, "acme")
	require.Equal(t, replacedAt.Add(time.Hour), acceptedUntil(a, "a_metric"))

	h.now = h.now.Add(time.Minute)
	writeDef(t, f.Tenants["acme"], "version: a3\nselectors: [a_third]\n")
	s.Reload()
	s = h.open(f)
	a, _ = tenantAllowlists(s, "acme")
	require.Equal(t, replacedAt.Add(time.Hour), acceptedUntil(a, "a_metric"), "a1, from the old format, until its own end")
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(a, "a_new"))
	var ps map[string]json.RawMessage
	b, err := os.ReadFile(filepath.Join(h.stateDir, "tenants", "acme.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &ps))
	require.NotContains(t, ps, "previous")
	require.Contains(t, ps, "previous_versions")
}
