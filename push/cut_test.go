package push

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// crashFile is a log file whose content survives a machine crash only as far
// as it was fsynced: cache is what the process sees, disk what a crash leaves.
// A failed Sync still writes the pages to disk (the error was another
// page's): the worst case for a refused record. It records its calls.
type crashFile struct {
	mu          sync.Mutex
	cache, disk []byte
	pos         int64
	failSyncs   int // how many Syncs fail next
	ops         []string
}

func newCrashFile(content []byte, failSyncs int) *crashFile {
	return &crashFile{cache: slices.Clone(content), disk: slices.Clone(content), pos: int64(len(content)), failSyncs: failSyncs}
}

func (c *crashFile) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if end := c.pos + int64(len(b)); end > int64(len(c.cache)) {
		c.cache = append(c.cache, make([]byte, end-int64(len(c.cache)))...)
	}
	copy(c.cache[c.pos:], b)
	c.pos += int64(len(b))
	c.ops = append(c.ops, "write")
	return len(b), nil
}

func (c *crashFile) Seek(offset int64, whence int) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if whence != io.SeekStart {
		return 0, fmt.Errorf("crashFile: whence %d not supported", whence)
	}
	c.pos = offset
	return offset, nil
}

func (c *crashFile) Truncate(size int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if size <= int64(len(c.cache)) {
		c.cache = c.cache[:size]
	} else {
		c.cache = append(c.cache, make([]byte, size-int64(len(c.cache)))...)
	}
	c.ops = append(c.ops, fmt.Sprintf("truncate %d", size))
	return nil
}

func (c *crashFile) Sync() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.disk = slices.Clone(c.cache)
	if c.failSyncs > 0 {
		c.failSyncs--
		c.ops = append(c.ops, "sync failed")
		return errDisk
	}
	c.ops = append(c.ops, "sync")
	return nil
}

func (c *crashFile) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops = append(c.ops, "close")
	return nil
}

// crashLog replaces the log's file by a crashFile holding what it holds,
// all durable, whose first failSyncs Syncs fail; it returns the content.
func (f *fixture) crashLog(failSyncs int) (*crashFile, []byte) {
	f.t.Helper()
	content, err := os.ReadFile(filepath.Join(f.dir, logFile))
	require.NoError(f.t, err)
	cf := newCrashFile(content, failSyncs)
	f.gw.mu.Lock()
	defer f.gw.mu.Unlock()
	require.NoError(f.t, f.gw.log.f.Close())
	f.gw.log.f = cf
	return cf, content
}

// A failed fsync whose log rewrite fails too, then a machine crash: the cut
// back to the durable bytes was fsynced before the file was closed, so the
// refused push (answered 500) is not replayed, and the client's retry
// counts once.
func TestPushFailedResetLeavesNoRefusedRecord(t *testing.T) {
	f := newFixture(t, testConfig())
	code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusOK, code, body)

	logPath, snap := filepath.Join(f.dir, logFile), filepath.Join(f.dir, snapshotFile)
	cf, acked := f.crashLog(1)
	require.NoError(t, os.MkdirAll(filepath.Join(snap, "x"), 0o750)) // the snapshot cannot be written

	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusInternalServerError, code, body)
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusServiceUnavailable, code, body, "the rewrite failed")
	cf.mu.Lock()
	require.Equal(t, []string{"write", "sync failed", fmt.Sprintf("truncate %d", len(acked)), "sync", "close"}, cf.ops)
	require.Equal(t, acked, cf.disk, "the refused record is cut from the disk")
	disk := cf.disk
	cf.mu.Unlock()

	// The machine crashes: what the disk holds is the log.
	f.close()
	require.NoError(t, os.WriteFile(logPath, disk, 0o640))
	require.NoError(t, os.RemoveAll(snap))
	f.w = &fakeWriter{}
	f.open()
	require.Equal(t, 1.0, f.state("acme")[awsKey], "only the acknowledged push is replayed")
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText) // the client's retry
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 2.0, f.state("acme")[awsKey])
}

// If the cut's fsync fails too, reset says so (the Gateway logs it): only
// then may a machine crash before a successful rewrite replay a refused push.
func TestLogResetReportsAFailedCut(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, snapshotFile, "x"), 0o750))
	cf := newCrashFile([]byte("durable+refused"), 1)
	l := &durableLog{dir: dir, f: cf, size: 15, synced: 7, open: openLogFile}
	err := l.reset(map[string]*tenantState{}, 1)
	require.ErrorContains(t, err, "cut push log back to its 7 durable bytes")
	require.ErrorIs(t, err, errDisk)
	require.Equal(t, []string{"truncate 7", "sync failed", "close"}, cf.ops)
	require.Nil(t, l.f, "the file is not used again")
}
