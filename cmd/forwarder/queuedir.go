package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
)

// fallbackQueueDir is where the queue goes when the default --queue.dir
// cannot be used, in the temporary directory ($TMPDIR).
func fallbackQueueDir() string { return filepath.Join(os.TempDir(), "phonehome-forwarder-queue") }

// usableQueueDir returns dir if the forwarder can create files in it, else
// fallback, with a warning. A deployment made for telemeter-client has no
// --queue.dir and perhaps no writable working directory: it queues in the
// temporary directory rather than fail to start, if the directory there is
// this process' own and closed to other users (checkPrivate). Neither being
// usable is an error naming both.
func usableQueueDir(logger *slog.Logger, dir, fallback string) (string, error) {
	err := checkWritable(dir)
	if err == nil {
		return dir, nil
	}
	// Private first: no probe file goes into another user's directory.
	if ferr := checkWritable(fallback, checkPrivate); ferr != nil {
		return "", fmt.Errorf("no writable queue directory (set --queue.dir to a writable volume): %w; %w", err, ferr)
	}
	logger.Warn("default --queue.dir is not writable, queueing in the temporary directory (set --queue.dir to a volume to keep the queue across restarts)",
		"dir", dir, "err", err, "using", fallback)
	return fallback, nil
}

// checkWritable creates dir if needed, runs the checks of first on it, then
// creates and removes a file in it: an existing directory (a read-only
// volume, another user's) can pass MkdirAll and still refuse the queue's
// files.
func checkWritable(dir string, first ...func(string) error) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("queue dir %s: %w", dir, err)
	}
	for _, check := range first {
		if err := check(dir); err != nil {
			return err
		}
	}
	f, err := os.CreateTemp(dir, ".write-probe-*")
	if err != nil {
		return fmt.Errorf("queue dir %s: not writable: %w", dir, err)
	}
	name := f.Name()
	err = f.Close()
	if rerr := os.Remove(name); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("queue dir %s: %w", dir, err)
	}
	return nil
}
