package status

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/atomicfile"
)

// A receiver killed while writing the history file leaves a temporary
// file: the next start removes it, and the history still loads.
func TestHistoryLoadRemovesTemporaryFilesOfACrash(t *testing.T) {
	s, l, clk := fixture(t)
	dir := t.TempDir()
	s.opts.HistoryFile = filepath.Join(dir, "history.json")
	clk.add(time.Minute)
	s.Record()
	require.NoError(t, s.save())
	_, err := atomicfile.Prepare(s.opts.HistoryFile, []byte("torn"), 0o600)
	require.NoError(t, err)

	s2 := New(slog.New(slog.DiscardHandler), nil, Options{Limiter: l, Now: clk.now, HistoryFile: s.opts.HistoryFile})
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only the history file is left")
	require.NotEmpty(t, s2.history, "the history file is untouched")
}
