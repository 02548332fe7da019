//go:build linux

// Linux only: /proc is the directory that refuses new files even to root,
// which permission bits do not stop (CI runs these tests as root).

package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// unwritableDir is an existing directory in which this process cannot
// create files, even as root.
func unwritableDir(t *testing.T) string {
	t.Helper()
	return "/proc"
}

func TestUsableQueueDir(t *testing.T) {
	ro := unwritableDir(t)
	t.Run("writable", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data", "queue")
		got, err := usableQueueDir(slog.New(slog.DiscardHandler), dir, filepath.Join(t.TempDir(), "fallback"))
		require.NoError(t, err)
		require.Equal(t, dir, got)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Empty(t, entries, "the probe file is removed")
	})
	// An existing directory passes MkdirAll: only writing tells.
	t.Run("exists but not writable", func(t *testing.T) {
		var log bytes.Buffer
		fallback := filepath.Join(t.TempDir(), "fallback")
		got, err := usableQueueDir(slog.New(slog.NewTextHandler(&log, nil)), ro, fallback)
		require.NoError(t, err)
		require.Equal(t, fallback, got)
		require.Contains(t, log.String(), "queueing in the temporary directory")
		require.Contains(t, log.String(), "dir="+ro)
	})
	t.Run("neither writable", func(t *testing.T) {
		_, err := usableQueueDir(slog.New(slog.DiscardHandler), ro, filepath.Join(ro, "phonehome-forwarder-queue"))
		require.ErrorContains(t, err, "no writable queue directory")
		require.ErrorContains(t, err, "queue dir "+ro+": not writable")
		require.ErrorContains(t, err, "queue dir "+filepath.Join(ro, "phonehome-forwarder-queue")+":")
	})
}

// TestNoWritableQueueDirExits1: with the default --queue.dir an existing
// directory it cannot write and $TMPDIR not writable either, the forwarder
// exits 1 naming both, rather than fail later on the first directory alone.
func TestNoWritableQueueDirExits1(t *testing.T) {
	ro := unwritableDir(t)
	cwd := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(cwd, "data"), 0o700))
	require.NoError(t, os.Symlink(ro, filepath.Join(cwd, "data", "queue")))
	t.Chdir(cwd)
	t.Setenv("TMPDIR", ro)
	var stderr bytes.Buffer
	code := run([]string{
		"--from=http://127.0.0.1:1", "--to=http://127.0.0.1:2", "--id=abc", "--match=up",
		"--anonymize-salt-file=" + writeFile(t, "salt", "0123456789abcdef-salt\n"), "--listen=127.0.0.1:0",
	}, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), "no writable queue directory")
	require.Contains(t, stderr.String(), "queue dir data/queue: not writable")
	require.Contains(t, stderr.String(), "queue dir "+filepath.Join(ro, "phonehome-forwarder-queue"))
}

// TestUnwritableDefaultQueueDirFallsBack: the default --queue.dir exists but
// cannot be written (a read-only volume): the forwarder queues in $TMPDIR.
func TestUnwritableDefaultQueueDirFallsBack(t *testing.T) {
	ro := unwritableDir(t)
	cwd := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(cwd, "data"), 0o700))
	require.NoError(t, os.Symlink(ro, filepath.Join(cwd, "data", "queue")))
	tmp := t.TempDir()
	s := startSelfIn(t, cwd, []string{"TMPDIR=" + tmp},
		"--from=http://127.0.0.1:1", "--to=http://127.0.0.1:2", "--id=abc", "--match=up",
		"--anonymize-salt-file="+writeFile(t, "salt", "0123456789abcdef-salt\n"), "--authorize=never")
	s.stop(t)
	require.Contains(t, s.log(), "queueing in the temporary directory")
	require.FileExists(t, filepath.Join(tmp, "phonehome-forwarder-queue", "lock"))
}

// TestFallbackQueueDirMustBePrivate: the fallback's name in $TMPDIR is
// fixed, so one that another user could have made first, or can read or
// write, is refused rather than used.
func TestFallbackQueueDirMustBePrivate(t *testing.T) {
	ro := unwritableDir(t)
	open := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(open, 0o700))
	require.NoError(t, os.Chmod(open, 0o777))
	_, err := usableQueueDir(slog.New(slog.DiscardHandler), ro, open)
	require.ErrorContains(t, err, "queue dir "+open+": open to other users (mode -rwxrwxrwx, want 0700)")

	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(t.TempDir(), link))
	_, err = usableQueueDir(slog.New(slog.DiscardHandler), ro, link)
	require.ErrorContains(t, err, "queue dir "+link+": not a directory")

	if os.Geteuid() == 0 { // only root can give a directory away
		theirs := filepath.Join(t.TempDir(), "theirs")
		require.NoError(t, os.Mkdir(theirs, 0o700))
		require.NoError(t, os.Chown(theirs, 4711, 4711))
		_, err = usableQueueDir(slog.New(slog.DiscardHandler), ro, theirs)
		require.ErrorContains(t, err, "queue dir "+theirs+": owned by uid 4711")
	}

	mine := filepath.Join(t.TempDir(), "mine")
	got, err := usableQueueDir(slog.New(slog.DiscardHandler), ro, mine)
	require.NoError(t, err)
	require.Equal(t, mine, got)
}

// TestExplicitQueueDirHasNoFallback: a --queue.dir given that cannot be
// used is an error (exit 1, naming it), never $TMPDIR (README, --queue.dir).
func TestExplicitQueueDirHasNoFallback(t *testing.T) {
	dir := filepath.Join(unwritableDir(t), "phonehome-queue")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var stderr bytes.Buffer
	args := []string{
		"--from=http://127.0.0.1:1", "--to=http://127.0.0.1:2", "--id=abc", "--match=up",
		"--anonymize-salt-file=" + writeFile(t, "salt", "0123456789abcdef-salt\n"), "--listen=127.0.0.1:0",
		"--queue.dir=" + dir,
	}
	code := make(chan int, 1)
	go func() { code <- run(args, &stderr) }()
	select {
	case c := <-code:
		require.Equal(t, 1, c)
	case <-time.After(30 * time.Second):
		t.Fatal("the forwarder started: it fell back from the --queue.dir given")
	}
	require.Contains(t, stderr.String(), "open queue")
	require.Contains(t, stderr.String(), dir)
	require.NoDirExists(t, filepath.Join(tmp, "phonehome-forwarder-queue"))
}
