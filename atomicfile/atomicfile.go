// Package atomicfile replaces small state files so that a crash leaves
// either the old or the new content, never a torn file.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with b: a temporary file in the same directory is
// written, fsynced and renamed over path, and the directory is fsynced so
// the rename itself survives a crash. The directory must exist. The file
// gets perm; a failed Write leaves no temporary file behind.
func Write(path string, b []byte, perm os.FileMode) error {
	p, err := Prepare(path, b, perm)
	if err != nil {
		return err
	}
	return p.Commit()
}

// tempPattern names path's temporary files (os.CreateTemp replaces "*"
// with a random decimal number; see staleTarget).
func tempPattern(path string) string { return "." + filepath.Base(path) + ".*.tmp" }

// Prepared is Write cut in two: the file is written and fsynced under a
// temporary name beside path, and not yet in place. A writer that prepares
// the content without holding its lock decides under the lock whether it
// still is to replace path (Commit) or not (Discard).
type Prepared struct {
	path, tmp string
}

// Prepare is Write's first half: it writes and fsyncs b under a temporary
// name. A failed Prepare leaves no temporary file behind.
func Prepare(path string, b []byte, perm os.FileMode) (*Prepared, error) {
	f, err := os.CreateTemp(filepath.Dir(path), tempPattern(path))
	if err != nil {
		return nil, fmt.Errorf("create temporary file for %s: %w", path, err)
	}
	p := &Prepared{path: path, tmp: f.Name()}
	if err := writeSync(f, b, perm); err != nil {
		_ = p.Discard()
		return nil, err
	}
	return p, nil
}

func writeSync(f *os.File, b []byte, perm os.FileMode) error {
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	if err := f.Chmod(perm); err != nil {
		_ = f.Close()
		return fmt.Errorf("chmod %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", f.Name(), err)
	}
	return nil
}

// Commit is Write's second half: it renames the prepared file over path and
// fsyncs the directory. If the rename fails, path is untouched and the
// temporary file is removed; if the directory's fsync fails, path may hold
// either content after a crash.
func (p *Prepared) Commit() error {
	if err := os.Rename(p.tmp, p.path); err != nil {
		_ = p.Discard()
		return fmt.Errorf("rename to %s: %w", p.path, err)
	}
	dir := filepath.Dir(p.path)
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// Discard removes the prepared file; path is untouched.
func (p *Prepared) Discard() error {
	if err := os.Remove(p.tmp); err != nil {
		return fmt.Errorf("remove %s: %w", p.tmp, err)
	}
	return nil
}
