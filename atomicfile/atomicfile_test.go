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

func TestRemoveStaleRemovesOnlyPathsTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	require.NoError(t, Write(p, []byte("kept"), 0o640))
	for range 2 { // as a process killed between Prepare and Commit leaves them
		_, err := Prepare(p, []byte("torn"), 0o640)
		require.NoError(t, err)
	}
	other, err := Prepare(filepath.Join(dir, "other.json"), []byte("x"), 0o640)
	require.NoError(t, err)

	n, err := RemoveStale(p)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"state.json", filepath.Base(other.tmp)}, names)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, "kept", string(b))
}
