package strictyaml

import (
	"strconv"
	"strings"
)

func prefix(path string) string {
	if path == "" {
		return ""
	}
	return path + ": "
}

// Join appends key to the YAML path, quoting it where it would be
// ambiguous (empty, or not only letters, digits, '_' and '-').
func Join(path, key string) string {
	k := key
	if key == "" || strings.ContainsFunc(key, func(r rune) bool { return !plainRune(r) }) {
		k = strconv.Quote(key)
	}
	if path == "" {
		return k
	}
	return path + "." + k
}

func plainRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-'
}
