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
	require.NoError(t, s.Reload())
	h.now = t0.Add(3 * time.Minute)
	writeDef(t, f.Default, "version: C\nselectors: [a_metric, c_metric]\n")
	require.NoError(t, s.Reload())
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
	require.NoError(t, s.Reload())
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
		require.NoError(t, s.Reload())
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
	require.NoError(t, s.Reload())
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

// TestServerRemovedTenantKeepsItsGrace: a tenant whose own file is removed
// from the configuration (a restart) is served the default at once, but
// its last own definition — and the versions that one replaced, each until
// its own end — stay accepted on top of the default's selectors; its state
// file keeps them across restarts and is deleted once their grace ends.
func TestServerRemovedTenantKeepsItsGrace(t *testing.T) {
	h := newHistory(t)
	const def = "version: d1\nselectors: [up]\n"
	withAcme := tenantFiles(t, def, map[string]string{"acme": "version: a1\nselectors: [a_metric]\n", "other": "version: o1\nselectors: [o_metric]\n"})
	without := Files{Default: withAcme.Default, Tenants: map[string]string{"other": withAcme.Tenants["other"]}}
	stateFile := filepath.Join(h.stateDir, "tenants", "acme.json")

	s := h.open(withAcme)
	t0 := h.now
	h.now = t0.Add(20 * time.Minute)
	writeDef(t, withAcme.Tenants["acme"], "version: a2\nselectors: [a_new]\n")
	require.NoError(t, s.Reload())

	// acme's file is removed, restart: the default is served at once.
	h.now = t0.Add(30 * time.Minute)
	removedAt := h.now
	s = h.open(without)
	require.Equal(t, "d1", s.Current("acme").Def.Version)
	a, ok := tenantAllowlists(s, "acme")
	require.True(t, ok, "acme is enforced during its grace period")
	require.True(t, a.Cur.AllowsFunc(func(string) string { return "up" }), "the default's selectors")
	require.Equal(t, removedAt.Add(time.Hour), acceptedUntil(a, "a_new"), "its last own definition")
	require.Equal(t, t0.Add(20*time.Minute).Add(time.Hour), acceptedUntil(a, "a_metric"), "the one before, until its own end")
	require.True(t, acceptedUntil(a, "o_metric").IsZero())
	require.FileExists(t, stateFile)

	// Restart within the grace: the same ends, not new ones.
	h.now = t0.Add(50 * time.Minute)
	s = h.open(without)
	a, ok = tenantAllowlists(s, "acme")
	require.True(t, ok)
	require.Equal(t, removedAt.Add(time.Hour), acceptedUntil(a, "a_new"))
	require.Equal(t, t0.Add(20*time.Minute).Add(time.Hour), acceptedUntil(a, "a_metric"))

	// The default changes meanwhile: acme follows it, with the default's previous version.
	writeDef(t, withAcme.Default, "version: d2\nselectors: [up2]\n")
	require.NoError(t, s.Reload())
	a, _ = tenantAllowlists(s, "acme")
	require.True(t, a.Cur.AllowsFunc(func(string) string { return "up2" }))
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(a, "up"))

	// Reloads after the grace periods end delete the state file; acme is
	// then held to the default alone.
	h.now = removedAt.Add(time.Hour)
	require.NoError(t, s.Reload())
	require.NoFileExists(t, stateFile)
	_, ok = tenantAllowlists(s, "acme")
	require.False(t, ok)
	s = h.open(without)
	_, ok = tenantAllowlists(s, "acme")
	require.False(t, ok)
}

// TestServerRemovedTenantStateExpiresAtStart: a receiver down for longer
// than the grace period deletes the state of a tenant removed before.
func TestServerRemovedTenantStateExpiresAtStart(t *testing.T) {
	h := newHistory(t)
	withAcme := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{"acme": "version: a1\nselectors: [a_metric]\n"})
	without := Files{Default: withAcme.Default}
	h.open(withAcme)
	h.now = h.now.Add(time.Minute)
	h.open(without)
	require.FileExists(t, filepath.Join(h.stateDir, "tenants", "acme.json"))
	h.now = h.now.Add(2 * time.Hour)
	s := h.open(without)
	_, ok := tenantAllowlists(s, "acme")
	require.False(t, ok)
	require.NoFileExists(t, filepath.Join(h.stateDir, "tenants", "acme.json"))

	// An unusable one is deleted too; a file that is no tenant's is not touched.
	require.NoError(t, os.WriteFile(filepath.Join(h.stateDir, "tenants", "acme.json"), []byte("{not json"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(h.stateDir, "tenants", "notes.txt"), []byte("x"), 0o600))
	h.open(without)
	require.NoFileExists(t, filepath.Join(h.stateDir, "tenants", "acme.json"))
	require.FileExists(t, filepath.Join(h.stateDir, "tenants", "notes.txt"))
}

// TestServerRemovedTenantComesBack: a tenant removed and given its file
// again within the grace period was served the default meanwhile: the
// default is accepted, and its own versions until their ends.
func TestServerRemovedTenantComesBack(t *testing.T) {
	h := newHistory(t)
	withAcme := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{"acme": "version: a1\nselectors: [a_metric]\n"})
	h.open(withAcme)
	h.now = h.now.Add(time.Minute)
	removedAt := h.now
	h.open(Files{Default: withAcme.Default})
	h.now = h.now.Add(time.Minute)
	writeDef(t, withAcme.Tenants["acme"], "version: a2\nselectors: [a_new]\n")
	s := h.open(withAcme)
	require.Equal(t, "a2", s.Current("acme").Def.Version)
	a, _ := tenantAllowlists(s, "acme")
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(a, "up"), "the default, served meanwhile")
	require.Equal(t, removedAt.Add(time.Hour), acceptedUntil(a, "a_metric"))
}

// TestServerRemovedTenantWithoutDefault: without a default, a removed
// tenant has no definition in force (Cur nil), only its last versions.
func TestServerRemovedTenantWithoutDefault(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "", map[string]string{"acme": "version: a1\nselectors: [a_metric]\n", "other": "version: o1\nselectors: [o_metric]\n"})
	h.open(f)
	s := h.open(Files{Tenants: map[string]string{"other": f.Tenants["other"]}})
	require.Nil(t, s.Current("acme"))
	a, ok := tenantAllowlists(s, "acme")
	require.True(t, ok)
	require.Nil(t, a.Cur)
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(a, "a_metric"))

	// Back with a new version, then removed again: that version is the
	// one remembered.
	h.now = h.now.Add(time.Minute)
	writeDef(t, f.Tenants["acme"], "version: a2\nselectors: [a_new]\n")
	h.open(f)
	h.now = h.now.Add(time.Minute)
	s = h.open(Files{Tenants: map[string]string{"other": f.Tenants["other"]}})
	a, _ = tenantAllowlists(s, "acme")
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(a, "a_new"))
}
