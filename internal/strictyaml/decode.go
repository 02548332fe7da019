// Package strictyaml decodes a configuration file strictly, as
// yaml.Decoder.KnownFields(true) does, but names every problem by its YAML
// path and line instead of stopping at the first one.
//
// yaml.v3 stops at the first error a value's own unmarshaler returns (a
// duration's unit, a byte size's unit), without its line, and names an
// unknown key by the Go type it is not a field of. The walk here follows the
// document and the Go value together through structs, maps and slices, and
// hands every other value to the strict decoder itself, so each value is
// decoded exactly as yaml.v3 decodes it.
package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"

	"go.yaml.in/yaml/v3"
)

// Decode decodes the one YAML document of b into out, a non-nil pointer.
// A key that names no field is an error, and so is a second document. It
// reports every problem, joined with errors.Join, each prefixed with its
// YAML path and line:
//
//	limits.defaults.max_serie_per_cluster: line 7: unknown key
//
// A value of the wrong type is named by its kind, never quoted: it may be
// a secret written in the wrong place (typeerror.go).
//
// It returns io.EOF if b holds no document (out is then unchanged).
func Decode(b []byte, out any) error {
	v := reflect.ValueOf(out)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return fmt.Errorf("strictyaml: decode into %T, not a non-nil pointer", out)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	w := &walker{root: v.Type()}
	if err := dec.Decode(&root{w: w, out: v.Elem()}); err != nil {
		return err // io.EOF, or a syntax error, which names its line
	}
	for { // further documents: only empty ones (a trailing "---"), which yaml.v3 ignored before
		var next yaml.Node
		err := dec.Decode(&next)
		switch {
		case errors.Is(err, io.EOF):
			return errors.Join(w.errs...)
		case err != nil:
			return errors.Join(append(w.errs, err)...)
		case !emptyDocument(&next):
			return errors.Join(append(w.errs, fmt.Errorf("line %d: a second YAML document: a file holds one", next.Line))...)
		}
	}
}

// unmarshalFunc decodes one node strictly. yaml.v3 hands it to the
// UnmarshalYAML(func(any) error) error method it still supports; it also
// works after that method returned, within the same Decode call.
type unmarshalFunc = func(any) error

// root receives the document's top node and its unmarshalFunc.
type root struct {
	w   *walker
	out reflect.Value
}

func (r *root) UnmarshalYAML(unmarshal unmarshalFunc) error {
	var n nodeOf
	if err := unmarshal(&n); err != nil {
		return err
	}
	r.w.value(unmarshal, n.node, r.out, "")
	return nil // the walker keeps the errors, so the decoder goes on
}

// nodeOf receives the node it is decoded from (the unmarshalFunc would
// decode into a *yaml.Node as into any struct).
type nodeOf struct{ node *yaml.Node }

func (n *nodeOf) UnmarshalYAML(node *yaml.Node) error {
	n.node = node
	return nil
}

// capture keeps the unmarshalFunc of one entry of a mapping or sequence, to
// decode it once the walker knows the Go value it belongs to.
type capture struct{ unmarshal unmarshalFunc }

func (c *capture) UnmarshalYAML(unmarshal unmarshalFunc) error {
	c.unmarshal = unmarshal
	return nil
}

var captureType = reflect.TypeFor[*capture]()

type walker struct {
	errs  []error
	root  reflect.Type            // of the value decoded into
	types map[string]reflect.Type // reachable from root, by name; built at the first type error
}

// value decodes node n into v. unmarshal is nil for a null node, which
// yaml.v3 decodes without calling any unmarshaler. It reports false where
// yaml.v3 leaves a sequence's element out: a null that v cannot hold.
func (w *walker) value(unmarshal unmarshalFunc, n *yaml.Node, v reflect.Value, path string) bool {
	if v.Type() == nodeType { // as yaml.v3 does; the unmarshalFunc would decode into it as into a struct
		v.Set(reflect.ValueOf(n).Elem())
		return true
	}
	if unmarshal == nil {
		if nullable(v.Kind()) { // as yaml.v3 decodes null
			v.SetZero()
		}
		return nullable(v.Kind())
	}
	if n.Kind == yaml.AliasNode || !walkable(v.Type(), n) {
		w.decode(unmarshal, n, v, path)
		return true
	}
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Struct:
		w.structFields(unmarshal, n, v, path)
	case reflect.Map:
		w.mapEntries(unmarshal, n, v, path)
	case reflect.Slice:
		w.sequence(unmarshal, n, v, path)
	}
	return true
}

// decode hands n to yaml.v3 whole.
func (w *walker) decode(unmarshal unmarshalFunc, n *yaml.Node, v reflect.Value, path string) {
	err := unmarshal(v.Addr().Interface())
	if err == nil {
		return
	}
	if scalarValue(v.Type(), n) { // its own unmarshaler's message quotes the value
		w.errs = append(w.errs, fmt.Errorf("%sline %d: want %s, found %s", prefix(path), n.Line, describe(v.Type()), found(resolve(n).ShortTag())))
		return
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		w.errs = append(w.errs, fmt.Errorf("%sline %d: %w", prefix(path), n.Line, err))
		return
	}
	for _, msg := range te.Errors { // each names its line
		w.errs = append(w.errs, errors.New(prefix(path)+unknownField.ReplaceAllString(w.typeError(msg), "${1}unknown key ${2}")))
	}
}

// unknownField is yaml.v3's message for an unknown key, which names a Go type.
var unknownField = regexp.MustCompile(`^(line \d+: )field (.*) not found in type \S+$`)

func (w *walker) structFields(unmarshal unmarshalFunc, n *yaml.Node, v reflect.Value, path string) {
	fields, ok := fieldsOf(v.Type())
	if !ok || !plainKeys(n) {
		w.decode(unmarshal, n, v, path)
		return
	}
	var entries map[string]*capture
	if err := unmarshal(&entries); err != nil { // a repeated key
		w.decode(unmarshal, n, v, path)
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		var key string
		if isNull(n.Content[i]) || n.Content[i].Decode(&key) != nil {
			continue // yaml.v3 skips a null key
		}
		p := Join(path, key)
		f, ok := fields[key]
		if !ok {
			w.errs = append(w.errs, fmt.Errorf("%s: line %d: unknown key", p, n.Content[i].Line))
			continue
		}
		w.value(entries[key].fn(), n.Content[i+1], v.Field(f), p)
	}
}

func (w *walker) mapEntries(unmarshal unmarshalFunc, n *yaml.Node, v reflect.Value, path string) {
	t := v.Type()
	entries := reflect.New(reflect.MapOf(t.Key(), captureType))
	if !plainKeys(n) || unmarshal(entries.Interface()) != nil {
		w.decode(unmarshal, n, v, path)
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(t))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := reflect.New(t.Key())
		if isNull(n.Content[i]) && !nullable(t.Key().Kind()) || n.Content[i].Decode(k.Interface()) != nil {
			continue // yaml.v3 skips a null key it cannot hold
		}
		ce := entries.Elem().MapIndex(k.Elem())
		if !ce.IsValid() {
			continue // a key not equal to itself (NaN)
		}
		e := reflect.New(t.Elem()).Elem()
		w.value(ce.Interface().(*capture).fn(), n.Content[i+1], e, Join(path, n.Content[i].Value))
		v.SetMapIndex(k.Elem(), e)
	}
}

func (w *walker) sequence(unmarshal unmarshalFunc, n *yaml.Node, v reflect.Value, path string) {
	var entries []*capture
	if err := unmarshal(&entries); err != nil || len(entries) != len(n.Content) {
		w.decode(unmarshal, n, v, path)
		return
	}
	s := reflect.MakeSlice(v.Type(), 0, len(entries))
	for i, c := range entries {
		e := reflect.New(v.Type().Elem()).Elem()
		if w.value(c.fn(), n.Content[i], e, fmt.Sprintf("%s[%d]", path, i)) {
			s = reflect.Append(s, e)
		}
	}
	v.Set(s)
}

// fn is nil for the entry of a null node.
func (c *capture) fn() unmarshalFunc {
	if c == nil {
		return nil
	}
	return c.unmarshal
}

// emptyDocument reports whether n is a document of nothing or of null.
func emptyDocument(n *yaml.Node) bool {
	return len(n.Content) == 0 || (len(n.Content) == 1 && isNull(n.Content[0]))
}
