package strictyaml

import (
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// walkable reports whether the walker follows n into a value of type t:
// a mapping into a struct or a map, a sequence into a slice, with no
// unmarshaler of their own.
func walkable(t reflect.Type, n *yaml.Node) bool {
	t, ok := plainType(t)
	switch {
	case !ok:
		return false
	case t.Kind() == reflect.Struct, t.Kind() == reflect.Map:
		return n.Kind == yaml.MappingNode
	case t.Kind() == reflect.Slice:
		return n.Kind == yaml.SequenceNode
	}
	return false
}

var (
	unmarshalerTypes = []reflect.Type{
		reflect.TypeFor[yaml.Unmarshaler](),
		reflect.TypeFor[interface{ UnmarshalYAML(unmarshalFunc) error }](),
		reflect.TypeFor[interface{ UnmarshalText([]byte) error }](),
	}
	nodeType = reflect.TypeFor[yaml.Node]()
)

// plainType dereferences t, and reports false if yaml.v3 would hand the
// value to an unmarshaler of its own, or copy a node into it.
func plainType(t reflect.Type) (reflect.Type, bool) {
	for {
		for _, u := range unmarshalerTypes {
			if reflect.PointerTo(t).Implements(u) {
				return t, false
			}
		}
		if t.Kind() != reflect.Pointer {
			return t, t != nodeType
		}
		t = t.Elem()
	}
}

// fieldsOf maps the YAML keys of struct type t to its field indices, as
// yaml.v3 names them. It reports false for embedded or inline fields,
// which are left to yaml.v3.
func fieldsOf(t reflect.Type) (map[string]int, bool) {
	fields := map[string]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			return nil, false
		}
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "" && !strings.Contains(string(f.Tag), ":") {
			tag = string(f.Tag)
		}
		if tag == "-" {
			continue
		}
		name, flags, _ := strings.Cut(tag, ",")
		if strings.Contains(","+flags+",", ",inline,") {
			return nil, false
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = i
	}
	return fields, true
}

// plainKeys reports whether every key of mapping n is a scalar other than
// a merge key ("<<"), whose semantics are left to yaml.v3.
func plainKeys(n *yaml.Node) bool {
	for i := 0; i < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Kind != yaml.ScalarNode || k.Value == "<<" {
			return false
		}
	}
	return true
}

func isNull(n *yaml.Node) bool { return n.ShortTag() == "!!null" }

// nullable reports whether yaml.v3 decodes a null into a value of kind k.
func nullable(k reflect.Kind) bool {
	return k == reflect.Interface || k == reflect.Pointer || k == reflect.Map || k == reflect.Slice
}
