// Package configdiff tells which top-level sections of a configuration
// changed, for a reload that applies some sections live and must say which
// others need a restart.
package configdiff

import (
	"reflect"
	"strings"
)

// Sections names, by YAML key, the top-level fields of the structs a and b
// (values of one struct type) that differ, except those live names: the
// sections a reload applies. Fields without a YAML key are not compared.
func Sections[T any](a, b T, live map[string]bool) []string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for i := range va.NumField() {
		key, _, _ := strings.Cut(va.Type().Field(i).Tag.Get("yaml"), ",")
		if key == "" || key == "-" || live[key] {
			continue
		}
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			out = append(out, key)
		}
	}
	return out
}
