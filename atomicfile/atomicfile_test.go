package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteReplacesAndLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	require.NoError(t, Write(p, []byte("one"), 0o640))
	require.NoError(t, Write(p, []byte("two"), 0o640))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, "two", string(b))
	fi, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o640), fi.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file is left")

	require.Error(t, Write(filepath.Join(dir, "missing", "x"), []byte("x"), 0o640), "the directory must exist")
}

func TestPreparedIsInPlaceOnlyOnceCommitted(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	require.NoError(t, Write(p, []byte("old"), 0o640))

	discarded, err := Prepare(p, []byte("dropped"), 0o640)
	require.NoError(t, err)
	kept, err := Prepare(p, []byte("new"), 0o640)
	require.NoError(t, err)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, "old", string(b), "prepared is not in place")

	require.NoError(t, discarded.Discard())
	require.NoError(t, kept.Commit())
	b, err = os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, "new", string(b))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file is left")
}
