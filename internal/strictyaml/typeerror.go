package strictyaml

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/alecthomas/units"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// yaml.v3 words a type error as "line 4: cannot unmarshal !!str `s3cr3t...`
// into int": it quotes the value (its first 7 characters past 10), and so do
// the messages of a duration's, a byte size's or a timestamp's own
// unmarshaler. In a tokens file, or any config, that value may be a secret
// written under the wrong key or in the wrong shape, and --check-config and
// the logs would print it. The errors say instead what was wanted and what
// kind of value was found, which the line then points at:
//
//	line 4: want a string, found a mapping
//	line 7: want a duration such as 30s, 5m or 1h30m, found a string
//
// The reasons of an unmarshaler of a mapping's own (a relabel config's: an
// unknown action, a bad regex) are kept: they name what is wrong in it.
var cannotUnmarshal = regexp.MustCompile(`^line (\d+): cannot unmarshal (\S+)`)

// typeError rewrites one of yaml.v3's type error messages without the
// value; other messages (an unknown or repeated key) are returned as they
// are: they quote keys, not values.
func (w *walker) typeError(msg string) string {
	m := cannotUnmarshal.FindStringSubmatch(msg)
	into := strings.LastIndex(msg, " into ") // the value comes before it; Go type names hold no " into "
	if m == nil || into < 0 {
		return msg
	}
	return fmt.Sprintf("line %s: want %s, found %s", m[1], w.want(msg[into+len(" into "):]), found(m[2]))
}

// found names the kind of YAML value of a tag.
func found(tag string) string {
	switch tag {
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "null"
	case "!!map":
		return "a mapping"
	case "!!seq":
		return "a sequence"
	case "!!timestamp":
		return "a timestamp"
	case "!!binary":
		return "binary data"
	}
	return "a value tagged " + tag
}

// scalarValue reports whether n, handed to yaml.v3 whole into a value of
// type t, is a scalar for an unmarshaler of t's own, or anything for a type
// written as a scalar: a failure is then the value's, which its message
// quotes, and want/found say all there is to say.
func scalarValue(t reflect.Type, n *yaml.Node) bool {
	t, plain := plainType(t)
	_, known := scalarTypes[t]
	return known || !plain && resolve(n).Kind == yaml.ScalarNode
}

// resolve follows an alias to its anchor.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	timeType     = reflect.TypeFor[time.Time]()
	// scalarTypes are the types with an unmarshaler of their own that the
	// configs hold, each written as a scalar, by what they want.
	scalarTypes = map[reflect.Type]string{
		reflect.TypeFor[model.Duration]():   "a duration such as 30s, 5m or 1h30m",
		reflect.TypeFor[units.Base2Bytes](): "a byte size such as 512KiB or 8MiB",
		timeType:                            "an RFC 3339 timestamp such as 2026-11-01T00:00:00Z",
	}
)

// want names, in YAML terms, what the Go type yaml.v3 names by typeName
// holds: a type of the decoded value, or one yaml.v3 names without it.
func (w *walker) want(typeName string) string {
	typeName = strings.TrimLeft(typeName, "*")
	if w.types == nil {
		w.types = map[string]reflect.Type{}
		collectTypes(w.root, w.types)
		for _, t := range []reflect.Type{durationType, timeType, reflect.TypeFor[bool](), reflect.TypeFor[string](),
			reflect.TypeFor[int](), reflect.TypeFor[int64](), reflect.TypeFor[uint](), reflect.TypeFor[uint64](), reflect.TypeFor[float64]()} {
			collectTypes(t, w.types) // types yaml.v3 may name that the value has none of
		}
	}
	if t, ok := w.types[typeName]; ok {
		return describe(t)
	}
	switch {
	case strings.HasPrefix(typeName, "[]"):
		return "a sequence"
	case strings.HasPrefix(typeName, "map["):
		return "a mapping"
	}
	return "a value of Go type " + typeName // e.g. the plain type of an UnmarshalYAML method
}

// collectTypes adds t and every type reachable from it to types, by name.
func collectTypes(t reflect.Type, types map[string]reflect.Type) {
	if _, ok := types[t.String()]; ok {
		return
	}
	types[t.String()] = t
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		collectTypes(t.Elem(), types)
	case reflect.Map:
		collectTypes(t.Key(), types)
		collectTypes(t.Elem(), types)
	case reflect.Struct:
		for i := range t.NumField() {
			collectTypes(t.Field(i).Type, types)
		}
	}
}

// describe names, in YAML terms, what a value of type t holds.
func describe(t reflect.Type) string {
	t, plain := plainType(t)
	if want, ok := scalarTypes[t]; ok {
		return want
	}
	if k := t.Kind(); !plain && k != reflect.Struct && k != reflect.Map && k != reflect.Slice {
		return "a valid " + t.String() // a scalar its unmarshaler parses
	}
	if t == durationType {
		return scalarTypes[reflect.TypeFor[model.Duration]()]
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a sequence"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return "a value of Go type " + t.String()
}
