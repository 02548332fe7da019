package atomicfile

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRemoveStaleRemovesOnlyPathsTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state")
	require.NoError(t, Write(p, []byte("kept"), 0o640))
	for range 2 { // as a process killed between Prepare and Commit leaves them
		_, err := Prepare(p, []byte("torn"), 0o640)
		require.NoError(t, err)
	}
	other, err := Prepare(filepath.Join(dir, "state.json"), []byte("x"), 0o640) // not p's, though it starts like p's
	require.NoError(t, err)

	var buf bytes.Buffer
	require.NoError(t, RemoveStale(slog.New(slog.NewJSONHandler(&buf, nil)), p, filepath.Join(dir, "missing", "x")))
	require.ElementsMatch(t, []string{"state", filepath.Base(other.tmp)}, names(t, dir))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, "kept", string(b))
	require.Contains(t, buf.String(), `"msg":"removed temporary files left by a crash","file":"`+p+`","count":2`)
}

func TestRemoveStaleInRemovesTheTemporaryFilesOfAnyFileWithTheSuffix(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"a.json", "b.json"} {
		require.NoError(t, Write(filepath.Join(dir, name), []byte("kept"), 0o600))
		_, err := Prepare(filepath.Join(dir, name), []byte("torn"), 0o600)
		require.NoError(t, err)
	}
	_, err := Prepare(filepath.Join(dir, "gone.json"), []byte("torn"), 0o600) // its first Write never finished
	require.NoError(t, err)
	_, err = Prepare(filepath.Join(dir, "notes.txt"), []byte("x"), 0o600) // another writer's
	require.NoError(t, err)
	notOurs := []string{".hidden.tmp", ".x.json.abc.tmp", "c.json.1.tmp"}
	for _, name := range notOurs {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}

	require.NoError(t, RemoveStaleIn(slog.New(slog.DiscardHandler), dir, ".json"))
	got := names(t, dir)
	require.Len(t, got, 6, "a.json, b.json, notes.txt's temporary file and %v", notOurs)
	require.Subset(t, got, append([]string{"a.json", "b.json"}, notOurs...))
}

func TestStaleTarget(t *testing.T) {
	for _, tc := range []struct {
		name, target string
		ok           bool
	}{
		{".state.json.123.tmp", "state.json", true},
		{".a.b.0.tmp", "a.b", true},
		{"state.json.123.tmp", "", false}, // no leading dot
		{".state.json.12a.tmp", "", false},
		{".state.json..tmp", "", false},
		{".123.tmp", "", false}, // no target
		{".state.json.123", "", false},
	} {
		target, ok := staleTarget(tc.name)
		require.Equal(t, tc.ok, ok, tc.name)
		require.Equal(t, tc.target, target, tc.name)
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
