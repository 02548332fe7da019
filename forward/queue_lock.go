//go:build unix

package forward

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
)

const lockFile = "lock"

// ErrQueueLocked is returned by OpenQueue when another process (or Queue)
// holds the directory: two writers would overwrite each other's records.
var ErrQueueLocked = errors.New("queue directory is in use by another forwarder")

// lockDir takes an exclusive flock on dir/lock, released when the returned
// file is closed (or the process dies, so a crash never leaves it stale).
// A file system without flock support is used unlocked, with a warning.
func lockDir(dir string, logger *slog.Logger) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open queue lock: %w", err)
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case err == nil:
		return f, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		_ = f.Close()
		return nil, fmt.Errorf("%w: %s", ErrQueueLocked, dir)
	default:
		logger.Warn("cannot lock the queue directory, make sure no other forwarder uses it", "dir", dir, "err", err)
		return f, nil
	}
}
