package gathering

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServerRemovedDefaultKeepsItsGrace: the default's file is removed
// from the configuration (a restart): tenants without a file of their own
// are served nothing (404) at once, but the default's last version — and
// the versions it replaced, each until its own end — stay accepted; its
// state file keeps them across restarts and is deleted once their grace
// ends.
func TestServerRemovedDefaultKeepsItsGrace(t *testing.T) {
	h := newHistory(t)
	with := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{"acme": "version: a1\nselectors: [a_metric]\n"})
	without := Files{Tenants: with.Tenants}
	stateFile := filepath.Join(h.stateDir, "default.json")

	s := h.open(with)
	t0 := h.now
	h.now = t0.Add(20 * time.Minute)
	writeDef(t, with.Default, "version: d2\nselectors: [up2]\n")
	require.NoError(t, s.Reload())

	h.now = t0.Add(30 * time.Minute)
	removedAt := h.now
	s = h.open(without)
	require.Nil(t, s.Current("other"))
	require.Equal(t, http.StatusNotFound, getAs(t, s, "other", "").Code, "nothing served, as without a default")
	require.Equal(t, "a1", s.Current("acme").Def.Version)
	def, tenants := s.Allowlists()
	require.NotNil(t, def, "the default's versions are enforced during their grace period")
	require.Nil(t, def.Cur)
	require.Equal(t, removedAt.Add(time.Hour), acceptedUntil(*def, "up2"), "its last version")
	require.Equal(t, t0.Add(20*time.Minute).Add(time.Hour), acceptedUntil(*def, "up"), "the one before, until its own end")
	require.True(t, acceptedUntil(tenants["acme"], "up2").IsZero(), "acme has its own, unchanged")
	var ps persistedState
	b, err := os.ReadFile(stateFile)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &ps))
	require.Empty(t, ps.Current, "no definition in force")

	// Restart within the grace: the same ends, not new ones.
	h.now = t0.Add(50 * time.Minute)
	s = h.open(without)
	def, _ = s.Allowlists()
	require.Equal(t, removedAt.Add(time.Hour), acceptedUntil(*def, "up2"))
	require.Equal(t, t0.Add(20*time.Minute).Add(time.Hour), acceptedUntil(*def, "up"))

	// Reloads after the grace periods end delete the state file and
	// recompute the policy: no default any more.
	changes := 0
	s.onChange = func() { changes++ }
	h.now = t0.Add(80 * time.Minute)
	require.NoError(t, s.Reload())
	require.FileExists(t, stateFile, "up2 is still in its grace period")
	require.Zero(t, changes)
	h.now = removedAt.Add(time.Hour)
	require.NoError(t, s.Reload())
	require.NoFileExists(t, stateFile)
	require.Equal(t, 1, changes)
	def, _ = s.Allowlists()
	require.Nil(t, def)
	require.FileExists(t, filepath.Join(h.stateDir, "tenants", "acme.json"))
}

// TestServerRemovedSection: without any definition file (the whole
// gathering section removed), a Server restored from the state directory
// keeps every removed definition's grace: the default's, and each
// tenant's on top of it.
func TestServerRemovedSection(t *testing.T) {
	h := newHistory(t)
	require.False(t, HasState(h.stateDir))
	with := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{"acme": "version: a1\nselectors: [a_metric]\n"})
	h.open(with)
	require.True(t, HasState(h.stateDir))

	h.now = h.now.Add(time.Minute)
	s := h.open(Files{})
	require.Nil(t, s.Current("acme"))
	require.Equal(t, http.StatusNotFound, getAs(t, s, "acme", "").Code)
	def, tenants := s.Allowlists()
	require.Nil(t, def.Cur)
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(*def, "up"))
	a := tenants["acme"]
	require.Nil(t, a.Cur)
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(a, "a_metric"), "its own last version")
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(a, "up"), "and the default's")

	// After the grace, a restart deletes every state file: nothing left.
	h.now = h.now.Add(time.Hour)
	s = h.open(Files{})
	def, tenants = s.Allowlists()
	require.Nil(t, def)
	require.Empty(t, tenants)
	require.False(t, HasState(h.stateDir))
}

// TestServerTenantMovedOffARemovedDefault: at the restart that removes
// the default, a tenant given its own file was served the default until
// then: the default's last version is among its previous versions.
func TestServerTenantMovedOffARemovedDefault(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{"acme": "version: a1\nselectors: [a_metric]\n"})
	h.open(Files{Default: f.Default})
	h.now = h.now.Add(time.Minute)
	s := h.open(Files{Tenants: f.Tenants})
	require.Equal(t, "a1", s.Current("acme").Def.Version)
	a, _ := tenantAllowlists(s, "acme")
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(a, "up"))
}
