package storage

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ExpandExternalLabels replaces the environment variable references in the
// values of ExternalLabels, as Prometheus' expand-external-labels feature
// does: ${NAME} is NAME's value and $$ a literal $. Replicas sharing one
// configuration file (a StatefulSet's ConfigMap) then differ by their
// environment, e.g. `replica: ${POD_NAME}`.
//
// A reference to an unset or empty variable is an error naming the key and
// the variable (Prometheus would expand it to "" and ship blocks without the
// label), and so is any other "$": $NAME must be written ${NAME}. lookup is
// os.LookupEnv outside tests. Call it once per load, before Validate: a
// reload expands the file again.
func (c *Config) ExpandExternalLabels(lookup func(string) (string, bool)) error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(c.ExternalLabels)) {
		v, err := expandEnv(c.ExternalLabels[k], lookup)
		if err != nil {
			errs = append(errs, fmt.Errorf("storage.external_labels.%s: %w", k, err))
			continue
		}
		c.ExternalLabels[k] = v
	}
	return errors.Join(errs...)
}

// expandEnv expands the ${NAME} and $$ of s.
func expandEnv(s string, lookup func(string) (string, bool)) (string, error) {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		s = s[i:]
		if strings.HasPrefix(s, "$$") {
			b.WriteByte('$')
			s = s[2:]
			continue
		}
		end := strings.IndexByte(s, '}')
		if !strings.HasPrefix(s, "${") || end < 0 || !envName(s[2:end]) {
			return "", fmt.Errorf("%q: a $ starts a reference ${NAME} (NAME: letters, digits and _), or $$ for a literal $", s)
		}
		name := s[2:end]
		v, ok := lookup(name)
		switch {
		case !ok:
			return "", fmt.Errorf("${%s}: environment variable %s is not set", name, name)
		case v == "":
			return "", fmt.Errorf("${%s}: environment variable %s is empty", name, name)
		}
		b.WriteString(v)
		s = s[end+1:]
	}
}

// envName reports whether name is a C identifier, as the shell's variables.
func envName(name string) bool {
	for i, r := range name {
		if r != '_' && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return name != ""
}
