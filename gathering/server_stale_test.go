package gathering

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServerRestartAfterLongOutageGivesAFullGrace: what was replaced while
// the receiver was down — a changed file, a removed tenant, a removed
// default alike — counts as replaced at start, however long ago the state
// was written: forwarders cannot poll a stopped receiver, so they are
// still on what it last served, and their backlog arrives after the start.
func TestServerRestartAfterLongOutageGivesAFullGrace(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{
		"acme": "version: a1\nselectors: [a_metric]\n", "other": "version: o1\nselectors: [o_metric]\n",
	})
	h.open(f)

	// Three weeks later: other's file changed, acme's and the default's removed.
	h.now = h.now.Add(21 * 24 * time.Hour)
	writeDef(t, f.Tenants["other"], "version: o2\nselectors: [o_new]\n")
	s := h.open(Files{Tenants: map[string]string{"other": f.Tenants["other"]}})
	def, tenants := s.Allowlists()
	started := h.now
	require.NotNil(t, def)
	require.Equal(t, started.Add(time.Hour), acceptedUntil(*def, "up"))
	require.Equal(t, started.Add(time.Hour), acceptedUntil(tenants["acme"], "a_metric"))
	require.Equal(t, started.Add(time.Hour), acceptedUntil(tenants["other"], "o_metric"))

	// Once that grace has ended, the next start deletes the removed ones' state.
	h.now = h.now.Add(time.Hour)
	s = h.open(Files{Tenants: map[string]string{"other": f.Tenants["other"]}})
	def, tenants = s.Allowlists()
	require.Nil(t, def)
	require.NotContains(t, tenants, "acme")
	require.Empty(t, tenants["other"].Prev)
	require.NoFileExists(t, filepath.Join(h.stateDir, "default.json"))
	require.NoFileExists(t, filepath.Join(h.stateDir, "tenants", "acme.json"))
}
