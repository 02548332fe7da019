//go:build unix

package main

import (
	"fmt"
	"os"
	"syscall"
)

// checkPrivate refuses a directory that another user made or can read or
// write: the fallback's name in $TMPDIR is fixed, so on a shared /tmp
// someone else could create it first, then read the queued telemetry or
// inject records the forwarder would send under this cluster's credential.
func checkPrivate(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("queue dir %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("queue dir %s: not a directory (a symbolic link?)", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("queue dir %s: owned by uid %d, not by this process (uid %d)", dir, st.Uid, os.Geteuid())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("queue dir %s: open to other users (mode %v, want 0700)", dir, perm)
	}
	return nil
}
