package storage

import (
	"strings"
	"testing"
)

// FuzzExpandEnv: any value expands or is refused, never panics; an
// expansion without references or $$ is the value itself, and one with
// every variable set to "v" holds no reference left.
func FuzzExpandEnv(f *testing.F) {
	for _, s := range []string{"", "r-${POD_NAME}", "$$", "$${X}$$", "${", "${}", "$X", "a$", "${1X}", "${A}${B}"} {
		f.Add(s)
	}
	lookup := func(string) (string, bool) { return "v", true }
	f.Fuzz(func(t *testing.T, s string) {
		out, err := expandEnv(s, lookup)
		if err != nil {
			return
		}
		if !strings.Contains(s, "$") && out != s {
			t.Fatalf("%q expanded to %q without a reference", s, out)
		}
		if strings.Count(out, "$") > strings.Count(s, "$")/2 {
			t.Fatalf("%q expanded to %q: a reference or $$ left", s, out)
		}
	})
}
