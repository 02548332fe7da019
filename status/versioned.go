package status

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// readVersioned decodes the JSON file at path (the history, the saved
// clusters) into out, reading at most maxBytes of it (0: no bound), and
// checks that *version, a field of out, is want. It reports false, and no
// error, for a missing file: the first start.
func readVersioned(path string, maxBytes int64, out any, version *int, want int) (bool, error) {
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer fh.Close()
	r := io.Reader(fh)
	if maxBytes > 0 {
		r = io.LimitReader(fh, maxBytes+1)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if maxBytes > 0 && int64(len(b)) > maxBytes {
		return false, fmt.Errorf("%s: larger than %d bytes", path, maxBytes)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return false, fmt.Errorf("decode %s: %w", path, err)
	}
	if *version != want {
		return false, fmt.Errorf("%s: format version %d, want %d", path, *version, want)
	}
	return true, nil
}
