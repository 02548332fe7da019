//go:build !unix

package forward

import (
	"errors"
	"log/slog"
	"os"
)

// ErrQueueLocked is returned by OpenQueue when another process holds the directory.
var ErrQueueLocked = errors.New("queue directory is in use by another forwarder")

// lockDir does not lock where flock is missing: the forwarder runs on Linux.
func lockDir(string, *slog.Logger) (*os.File, error) { return nil, nil }
