package strictyaml

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/units"
	"github.com/prometheus/common/model"
	promrelabel "github.com/prometheus/prometheus/model/relabel"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// testConfig has the shapes of the binaries' configurations.
type testConfig struct {
	Name     string                `yaml:"name"`
	Window   model.Duration        `yaml:"window"`
	Size     *units.Base2Bytes     `yaml:"size,omitempty"`
	Created  time.Time             `yaml:"created"`
	Limits   testLimits            `yaml:"limits"`
	Items    []testItem            `yaml:"items"`
	Ptrs     []*testItem           `yaml:"ptrs"`
	Labels   map[string]string     `yaml:"labels"`
	Relabel  []*promrelabel.Config `yaml:"relabel_configs"`
	Any      any                   `yaml:"any"`
	Node     yaml.Node             `yaml:"node"`
	Nested   map[string][]testItem `yaml:"nested"`
	Ints     map[int]testItem      `yaml:"ints"`
	Untagged int
	Skipped  int `yaml:"-"`
	hidden   int //nolint:unused // an unexported field is not a key
}

type testLimits struct {
	Defaults testSpec            `yaml:"defaults"`
	Tenants  map[string]testSpec `yaml:"tenants"`
}

type testSpec struct {
	MaxSeries *int              `yaml:"max_series_per_cluster,omitempty"`
	MaxBody   *units.Base2Bytes `yaml:"max_body_bytes,omitempty"`
	Idle      *model.Duration   `yaml:"idle,omitempty"`
}

type testItem struct {
	URL     string         `yaml:"url"`
	Timeout model.Duration `yaml:"timeout"`
}

func TestDecodeNamesEveryProblemByPathAndLine(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{{
		name: "duration unit",
		doc:  "window: 6hours\n",
		want: []string{`window: line 1: want a duration such as 30s, 5m or 1h30m, found a string`},
	}, {
		name: "byte size unit",
		doc:  "limits:\n  defaults:\n    max_body_bytes: 8Mb\n",
		want: []string{"limits.defaults.max_body_bytes: line 3: want a byte size such as 512KiB or 8MiB, found a string"},
	}, {
		name: "unknown key and bad duration, both",
		doc:  "limits:\n  defaults:\n    max_serie_per_cluster: 5\nitems:\n- url: x\n  timeout: 30seconds\n- url: y\n  timout: 1s\n",
		want: []string{
			"limits.defaults.max_serie_per_cluster: line 3: unknown key",
			`items[0].timeout: line 6: want a duration such as 30s, 5m or 1h30m, found a string`,
			"items[1].timout: line 8: unknown key",
		},
	}, {
		name: "map values and pointers",
		doc:  "limits:\n  tenants:\n    acme:\n      idle: 1x\n    a.b:\n      max_series_per_cluster: many\nptrs:\n- timeout: 1y2\n",
		want: []string{
			`limits.tenants.acme.idle: line 4: want a duration such as 30s, 5m or 1h30m, found a string`,
			"limits.tenants.\"a.b\".max_series_per_cluster: line 6: want an integer, found a string",
			`ptrs[0].timeout: line 8: want a duration such as 30s, 5m or 1h30m, found a string`,
		},
	}, {
		name: "the kind of value found, never the value",
		doc: "name: {a: b}\nitems: s3cr3t-value\nlabels: [s3cr3t]\nlimits:\n  defaults: [1]\nuntagged: true\n" +
			"created: s3cr3t-value\nwindow: 30\nsize: [1]\nptrs:\n- s3cr3t-value\n- !custom s3cr3t\nints:\n  s3cr3t: {}\n" +
			"relabel_configs: [s3cr3t, {action: dropp}]\n", // its own unmarshaler's reasons about a mapping are kept
		want: []string{
			"name: line 1: want a string, found a mapping",
			"items: line 2: want a sequence, found a string",
			"labels: line 3: want a mapping, found a sequence",
			"limits.defaults: line 5: want a mapping, found a sequence",
			"untagged: line 6: want an integer, found a boolean",
			"created: line 7: want an RFC 3339 timestamp such as 2026-11-01T00:00:00Z, found a string",
			"window: line 8: want a duration such as 30s, 5m or 1h30m, found an integer",
			"size: line 9: want a byte size such as 512KiB or 8MiB, found a sequence",
			"ptrs[0]: line 11: want a mapping, found a string",
			"ptrs[1]: line 12: want a mapping, found a value tagged !custom",
			"ints: line 14: want an integer, found a string",
			"relabel_configs[0]: line 15: want a mapping, found a string",
			"relabel_configs[1]: line 15: unknown relabel action \"dropp\"",
		},
	}, {
		name: "inside a value with its own unmarshaler",
		doc:  "relabel_configs:\n- action: drop\n  sourc_labels: [a]\n",
		want: []string{"relabel_configs[0]: line 3: unknown key sourc_labels"},
	}, {
		name: "unknown key at the top, a repeated key",
		doc:  "nme: x\nlabels: {a: b, a: c}\n",
		want: []string{"nme: line 1: unknown key", `labels: line 2: mapping key "a" already defined at line 2`},
	}, {
		name: "second document",
		doc:  "name: x\n---\nname: y\n",
		want: []string{"line 2: a second YAML document: a file holds one"},
	}, {
		name: "a document after empty ones",
		doc:  "name: x\n---\n--- ~\n---\nname: y\n",
		want: []string{"line 4: a second YAML document: a file holds one"},
	}, {
		name: "ignored and unexported fields are unknown keys",
		doc:  "skipped: 1\nhidden: 2\n",
		want: []string{"skipped: line 1: unknown key", "hidden: line 2: unknown key"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var c testConfig
			err := Decode([]byte(tc.doc), &c)
			require.Error(t, err)
			require.Equal(t, strings.Join(tc.want, "\n"), err.Error())
			require.NotContains(t, err.Error(), "s3cr3t")
			var strict testConfig // yaml.v3 finds a problem too
			require.Error(t, strictDecode(tc.doc, &strict))
		})
	}
}

func TestDecodeAcceptsWhatYAMLAccepts(t *testing.T) {
	doc := `
name: x
window: 5m
size: 1KiB
created: 2026-01-01T00:00:00Z
limits:
  defaults: {max_series_per_cluster: 3, max_body_bytes: 2MiB}
  tenants:
    acme: {idle: 1h}
    empty: ~
items:
- &item {url: a, timeout: 1s}
- *item
ptrs: [~, {url: b}]
labels: {a: b}
relabel_configs:
- {action: keep, source_labels: [job], regex: node}
any: {x: [1, 2]}
node: {y: 1}
nested:
  n: [{url: c}, &base {url: d}]
ints:
  1: {url: e}
  2:
    <<: *base
    timeout: 2s
untagged: 7
`
	var got, want testConfig
	require.NoError(t, Decode([]byte(doc), &got))
	require.NoError(t, strictDecode(doc, &want))
	require.Equal(t, want, got)
	require.Equal(t, "a", got.Items[1].URL)
	require.Equal(t, "d", got.Ints[2].URL)
}

func TestDecodeEmpty(t *testing.T) {
	for _, doc := range []string{"", "# only a comment\n"} {
		c := testConfig{Name: "kept"}
		require.ErrorIs(t, Decode([]byte(doc), &c), io.EOF, "%q", doc)
		require.Equal(t, "kept", c.Name)
	}
	c := testConfig{Name: "kept"}
	require.NoError(t, Decode([]byte("~\n"), &c))
	require.Equal(t, "kept", c.Name)

	// A trailing "---" (empty documents), which yaml.v3 ignored, still is.
	require.NoError(t, Decode([]byte("name: x\n---\n--- ~\n"), &c))
	require.Equal(t, "x", c.Name)
}

func TestDecodeSyntaxError(t *testing.T) {
	var c testConfig
	err := Decode([]byte("name: [x\n"), &c)
	require.Error(t, err)
	require.Contains(t, err.Error(), "line")
	require.False(t, errors.Is(err, io.EOF))
}

// strictDecode is the yaml.v3 decode Decode replaces.
func strictDecode(doc string, out any) error {
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		return err
	}
	for {
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil || !emptyDocument(&next) {
			return errors.New("second document")
		}
	}
}

// FuzzDecode: Decode accepts exactly the documents yaml.v3's strict decoder
// accepts, into the same value, never panics, and words every type error
// without the value.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		"window: 6hours\nlimits:\n  defaults:\n    max_serie_per_cluster: 5\n    max_body_bytes: 8Mb\n",
		"items:\n- &i {url: a, timeout: 1s}\n- *i\nints:\n  2:\n    <<: {url: b}\n",
		"relabel_configs:\n- {action: drop, source_labels: [a], regex: x}\nnested: {a: [~, {url: c}]}\n",
		"labels: {a: b, a: c}\nnode: {y: [1]}\nany: &x [*x]\n",
		"name: x\n---\nname: y\n",
		"limits: {tenants: {acme: {idle: 1h, max_series_per_cluster: !!str 3}}}\ncreated: 2026-01-01\n",
		"name: {a: b}\nitems: s3cr3t\nuntagged: true\ncreated: s3cr3t\nptrs: [!custom x]\nints: {x: {}}\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		var got, want testConfig
		err := Decode([]byte(doc), &got)
		wantErr := strictDecode(doc, &want)
		if errors.Is(wantErr, io.EOF) {
			require.ErrorIs(t, err, io.EOF)
			return
		}
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("Decode: %v\nyaml.v3: %v", err, wantErr)
		}
		if err != nil {
			require.NotContains(t, err.Error(), "cannot unmarshal", "yaml.v3's type error quotes the value")
			return
		}
		g, gerr := yaml.Marshal(&got)
		w, werr := yaml.Marshal(&want)
		if gerr == nil && werr == nil {
			require.Equal(t, string(w), string(g))
		}
	})
}
