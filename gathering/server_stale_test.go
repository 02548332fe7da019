package gathering

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServerStaleStateGivesNoFreshGrace: a receiver down for longer than
// the grace period starts with nothing more accepted: what its state file
// had in force counts as replaced when it was last served, not at start —
// a changed file, a removed tenant, a removed default alike — and the
// state of removed definitions is deleted.
func TestServerStaleStateGivesNoFreshGrace(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{
		"acme": "version: a1\nselectors: [a_metric]\n", "other": "version: o1\nselectors: [o_metric]\n",
	})
	h.open(f)
	h.now = h.now.Add(time.Minute)
	h.open(f) // no tenant moved off the default any more: nothing in grace
	h.now = h.now.Add(10 * time.Minute)
	h.stop()

	// Three weeks later: other's file changed, acme's and the default's removed.
	h.now = h.now.Add(21 * 24 * time.Hour)
	writeDef(t, f.Tenants["other"], "version: o2\nselectors: [o_new]\n")
	s := h.start(Files{Tenants: map[string]string{"other": f.Tenants["other"]}})
	def, tenants := s.Allowlists()
	require.Nil(t, def, "the default's grace ended long ago")
	require.NotContains(t, tenants, "acme", "acme's grace ended long ago")
	require.Empty(t, tenants["other"].Prev, "o1 was replaced when last served, three weeks ago")
	require.NoFileExists(t, filepath.Join(h.stateDir, "default.json"))
	require.NoFileExists(t, filepath.Join(h.stateDir, "tenants", "acme.json"))

	// Within the grace of the stop, the same restart keeps them until then.
	h = newHistory(t)
	h.open(f)
	h.now = h.now.Add(time.Minute)
	h.open(f)
	h.now = h.now.Add(10 * time.Minute)
	h.stop()
	stoppedAt := h.now
	h.now = h.now.Add(20 * time.Minute)
	writeDef(t, f.Tenants["other"], "version: o3\nselectors: [o_third]\n")
	s = h.start(Files{Tenants: map[string]string{"other": f.Tenants["other"]}})
	def, tenants = s.Allowlists()
	require.Equal(t, stoppedAt.Add(time.Hour), acceptedUntil(*def, "up"))
	require.Equal(t, stoppedAt.Add(time.Hour), acceptedUntil(tenants["acme"], "a_metric"))
	require.Equal(t, stoppedAt.Add(time.Hour), acceptedUntil(tenants["other"], "o_new"))
}

// TestServerCrashKeepsMostOfTheGrace: without a stop (a crash), the last
// time a running receiver recorded serving its definition counts:
// reloads record it every servedRefresh.
func TestServerCrashKeepsMostOfTheGrace(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "version: d1\nselectors: [up]\n", nil)
	s := h.open(f)
	h.now = h.now.Add(30 * time.Second)
	s.Reload() // too soon to record again
	h.now = h.now.Add(time.Minute)
	s.Reload()
	recorded := h.now
	h.now = h.now.Add(50 * time.Second)
	s.Reload()

	h.now = h.now.Add(10 * time.Minute) // crashed meanwhile
	writeDef(t, f.Default, "version: d2\nselectors: [up2]\n")
	s = h.start(f)
	def, _ := s.Allowlists()
	require.Equal(t, recorded.Add(time.Hour), acceptedUntil(*def, "up"))
}

// TestServerStateWithoutServedTime: a state file written before the time
// it was last served was recorded still gives a grace period from the
// start to what it had in force.
func TestServerStateWithoutServedTime(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "version: d2\nselectors: [up2]\n", nil)
	d1, err := DecodeYAML([]byte("version: d1\nselectors: [up]\n"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(h.stateDir, "default.json"), fmt.Appendf(nil, `{"current":%s}`, d1.Encode()), 0o600))
	s := h.start(f)
	def, _ := s.Allowlists()
	require.Equal(t, h.now.Add(time.Hour), acceptedUntil(*def, "up"))
}
