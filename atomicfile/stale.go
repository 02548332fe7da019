package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// RemoveStale removes the temporary files that a Write or Prepare of each
// of paths left when the process died before it renamed or removed them,
// and logs at info how many it removed: nothing else removes them, so a
// crash loop would fill the disk. Call it only where no Write of those
// paths can be running (at start, before the files' writers). A missing
// directory has nothing to remove.
func RemoveStale(logger *slog.Logger, paths ...string) error {
	for _, path := range paths {
		base := filepath.Base(path)
		n, err := removeStale(filepath.Dir(path), func(target string) bool { return target == base })
		if err != nil {
			return err
		}
		if n > 0 {
			logger.Info("removed temporary files left by a crash", "file", path, "count", n)
		}
	}
	return nil
}

// RemoveStaleIn is RemoveStale for every file in dir whose name ends in
// suffix: a directory of files named after what they hold (jobs, tenants),
// whose names are not known after a crash.
func RemoveStaleIn(logger *slog.Logger, dir, suffix string) error {
	n, err := removeStale(dir, func(target string) bool { return strings.HasSuffix(target, suffix) })
	if err != nil {
		return err
	}
	if n > 0 {
		logger.Info("removed temporary files left by a crash", "dir", dir, "suffix", suffix, "count", n)
	}
	return nil
}

// removeStale removes the temporary files in dir whose target (the file
// they were to replace) is owned, and returns how many it removed.
func removeStale(dir string, owned func(target string) bool) (int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list %s for stale temporary files: %w", dir, err)
	}
	n := 0
	for _, e := range entries {
		target, ok := staleTarget(e.Name())
		if !ok || e.IsDir() || !owned(target) {
			continue
		}
		name := filepath.Join(dir, e.Name())
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("remove stale %s: %w", name, err)
		}
		n++
	}
	return n, nil
}

// staleTarget returns the base name of the file that name, a temporary
// file of tempPattern, was to replace: name is "." + target + "." + a
// decimal number + ".tmp". The number must be all digits, as
// os.CreateTemp makes it, so that the temporary files of "state" are not
// taken for those of "state.json" (".state.json.12.tmp"), nor a file
// that merely starts with a dot and ends in .tmp for one of ours.
func staleTarget(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return "", false
	}
	if rest, ok = strings.CutSuffix(rest, ".tmp"); !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 || i == len(rest)-1 {
		return "", false
	}
	for _, c := range rest[i+1:] {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return rest[:i], true
}
