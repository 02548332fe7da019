package gathering

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const validJSON = `{"version":"v1","selectors":["up","cluster_version{type=\"current\"}"],` +
	`"anonymize_labels":["namespace"],"max_series":{"up":10},"min_forwarder_version":"0.1.0"}`

func TestDecodeValid(t *testing.T) {
	d, err := Decode([]byte(validJSON))
	require.NoError(t, err)
	require.Equal(t, "v1", d.Version)
	require.Equal(t, []string{"up", `cluster_version{type="current"}`}, d.Selectors)
	require.Equal(t, map[string]int{"up": 10}, d.MaxSeries)
	// Canonical: decoding the encoding gives the same bytes.
	d2, err := Decode(d.Encode())
	require.NoError(t, err)
	require.Equal(t, d.Encode(), d2.Encode())
	require.Equal(t, ETag(d.Encode()), ETag(d2.Encode()))
	require.True(t, strings.HasPrefix(ETag(d.Encode()), `"`) && strings.HasSuffix(ETag(d.Encode()), `"`), "strong, quoted")

	c, err := Compile(d)
	require.NoError(t, err)
	require.Len(t, c.Caps, 1)
	require.Equal(t, "up", c.Caps[0].Selector)
	require.Equal(t, 2, c.Allow.Len())
}

func TestDecodeRejects(t *testing.T) {
	many := make([]string, MaxSelectors+1)
	for i := range many {
		many[i] = fmt.Sprintf("%q", fmt.Sprintf("m%d", i))
	}
	for _, tc := range []struct {
		name, doc string
		want      error
		contains  string
	}{
		{"not json", `selectors: [up]`, ErrMalformed, ""},
		{"unknown field", `{"version":"v1","selectors":["up"],"exec":"rm -rf /"}`, ErrMalformed, "unknown field"},
		{"trailing data", `{"version":"v1","selectors":["up"]} {}`, ErrMalformed, "after the document"},
		{"wrong type", `{"version":1,"selectors":["up"]}`, ErrMalformed, ""},
		{"no version", `{"selectors":["up"]}`, ErrInvalid, "version: required"},
		{"bad version", `{"version":"v 1","selectors":["up"]}`, ErrInvalid, "version"},
		{"no selectors", `{"version":"v1","selectors":[]}`, ErrInvalid, "at least one"},
		{"bad selector", `{"version":"v1","selectors":["up{"]}`, ErrInvalid, "selectors[0]"},
		{"matches everything", `{"version":"v1","selectors":["{a=~\".*\"}"]}`, ErrInvalid, "selectors[0]"},
		{"duplicate selector", `{"version":"v1","selectors":["up","up"]}`, ErrInvalid, "duplicate"},
		{"bad label", `{"version":"v1","selectors":["up"],"anonymize_labels":["a-b"]}`, ErrInvalid, "not a label name"},
		{"reserved label", `{"version":"v1","selectors":["up"],"anonymize_labels":["_id"]}`, ErrInvalid, "cannot be anonymized"},
		{"cap on unknown selector", `{"version":"v1","selectors":["up"],"max_series":{"down":1}}`, ErrInvalid, "not one of the selectors"},
		{"zero cap", `{"version":"v1","selectors":["up"],"max_series":{"up":0}}`, ErrInvalid, "want 1.."},
		{"bad min version", `{"version":"v1","selectors":["up"],"min_forwarder_version":"latest"}`, ErrInvalid, "min_forwarder_version"},
		{"too many selectors", `{"version":"v1","selectors":[` + strings.Join(many, ",") + `]}`, ErrTooLarge, ""},
		{"too many bytes", `{"version":"v1","selectors":["` + strings.Repeat("a", MaxBytes) + `"]}`, ErrTooLarge, ""},
		{"long selector", `{"version":"v1","selectors":["` + strings.Repeat("a", MaxSelectorLength+1) + `"]}`, ErrInvalid, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.doc))
			require.Error(t, err)
			require.True(t, errors.Is(err, tc.want), "%v", err)
			require.ErrorContains(t, err, tc.contains)
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	_, err := Decode([]byte(`{"version":"","selectors":["up{","x{"],"anonymize_labels":["__name__"]}`))
	require.ErrorContains(t, err, "version: required")
	require.ErrorContains(t, err, "selectors[0]")
	require.ErrorContains(t, err, "selectors[1]")
	require.ErrorContains(t, err, "anonymize_labels[0]")
}

func TestDecodeYAMLStrict(t *testing.T) {
	d, err := DecodeYAML([]byte("version: v2\nselectors:\n  - up\nanonymize_labels: [namespace]\n"))
	require.NoError(t, err)
	require.Equal(t, "v2", d.Version)
	_, err = DecodeYAML([]byte("version: v2\nselectors: [up]\nscript: x\nmax_series: {up: many}\n"))
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "script: line 3: unknown key\nmax_series.up: line 4: want an integer, found a string")
	_, err = DecodeYAML([]byte(""))
	require.ErrorIs(t, err, ErrMalformed)
	_, err = DecodeYAML([]byte("version: v2\nselectors: [up]\n---\nversion: v3\n"))
	require.ErrorIs(t, err, ErrMalformed)
}

func TestMinForwarderVersion(t *testing.T) {
	d := &Definition{Version: "v1", Selectors: []string{"up"}, MinForwarderVersion: "0.3.0"}
	require.Error(t, d.Allows("0.2.9"))
	require.Error(t, d.Allows("v0.2.10"))
	require.NoError(t, d.Allows("0.3.0"))
	require.NoError(t, d.Allows("1.0.0-rc.1"))
	require.NoError(t, d.Allows("devel"), "development builds are not refused")
	require.NoError(t, (&Definition{}).Allows("0.0.1"))
}

// FuzzDecode: Decode never panics, and whatever it accepts is valid,
// compiles, and survives an encode/decode round trip unchanged.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		validJSON,
		`{"version":"v1","selectors":["up"]}`,
		`{"version":"v1","selectors":["{__name__=~\"a.*\",job!=\"\"}"],"max_series":{"{__name__=~\"a.*\",job!=\"\"}":5}}`,
		`{"version":"v1","selectors":["up"],"exec":1}`,
		`{"version":"v1","selectors":["up"]}{}`,
		`[]`, `null`, `{"selectors":null}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		c, err := Compile(d)
		if err != nil {
			t.Fatalf("accepted but does not compile: %v", err)
		}
		d2, err := Decode(c.Body)
		if err != nil {
			t.Fatalf("canonical body does not decode: %v", err)
		}
		if string(d2.Encode()) != string(c.Body) {
			t.Fatalf("round trip changed the body: %s vs %s", d2.Encode(), c.Body)
		}
	})
}
