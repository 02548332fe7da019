package gathering

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/atomicfile"
)

// A receiver killed while writing a state file leaves a temporary file
// (for a tenant's first one, with no state file beside it): the next
// start removes it, and the state it was to replace still keeps the grace.
func TestServerStartRemovesTemporaryStateFilesOfACrash(t *testing.T) {
	h := newHistory(t)
	f := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{"a": "version: a1\nselectors: [a_metric]\n"})
	s := h.open(f)
	writeDef(t, f.Tenants["a"], "version: a2\nselectors: [a_new]\n")
	require.NoError(t, s.Reload())
	changedAt := h.now
	for _, path := range []string{statePath(h.stateDir, DefaultTenant), statePath(h.stateDir, "a"), statePath(h.stateDir, "new")} {
		_, err := atomicfile.Prepare(path, []byte("torn"), 0o640)
		require.NoError(t, err)
	}

	h.now = h.now.Add(time.Minute)
	s = h.open(f)
	for _, dir := range []string{h.stateDir, filepath.Join(h.stateDir, "tenants")} {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			require.False(t, strings.HasSuffix(e.Name(), ".tmp"), "%s left by the crash in %s", e.Name(), dir)
		}
	}
	a, _ := tenantAllowlists(s, "a")
	require.Equal(t, changedAt.Add(h.grace), acceptedUntil(a, "a_metric"), "a1 is still in its grace period")
}
