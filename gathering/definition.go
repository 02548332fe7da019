// Package gathering is the fleet's gathering definition: what every
// forwarder collects, served by the receiver at GET /api/v1/gathering and
// polled by forwarders. A definition is data only — a version, series
// selectors, labels to anonymize, optional per-selector series caps and an
// optional minimum forwarder version. Nothing in it is code or is executed.
//
// The package holds the document (strict decoding with size limits and
// validation, canonical encoding, strong ETag), the receiver's side (a file
// hot-reloaded into an HTTP handler, keeping the last good definition and the
// versions it replaced, each for a grace period) and the forwarder's side (a
// poller with an on-disk cache of the last good definition).
package gathering

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/common/model"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/internal/strictyaml"
)

// InfoMetric is the series every forwarder sends with the version of the
// definition it uses (value 1), so the fleet sees which clusters run which
// version. Fleet dashboards rely on this exact name.
const InfoMetric = "phonehome_gathering_definition_info"

// Size limits of a definition. A document over any of them is refused whole.
const (
	MaxBytes            = 1 << 20 // encoded document
	MaxSelectors        = 5000
	MaxSelectorLength   = 4096
	MaxAnonymizeLabels  = 256
	MaxVersionLength    = 64
	MaxSeriesCapPerRule = 1_000_000
)

// Errors, by failure class. Decode and Validate wrap exactly one of them.
var (
	ErrTooLarge  = errors.New("definition too large")
	ErrMalformed = errors.New("malformed definition")
	ErrInvalid   = errors.New("invalid definition")
)

// Definition is the gathering definition document.
type Definition struct {
	// Version names this definition (e.g. "2026-11-25.1"); it is forwarded
	// as the version label of InfoMetric. [A-Za-z0-9._:+-], at most 64.
	Version string `json:"version" yaml:"version"`
	// Selectors are PromQL series selectors: what forwarders federate and
	// let through. At least one.
	Selectors []string `json:"selectors" yaml:"selectors"`
	// AnonymizeLabels are label names whose values forwarders replace by
	// their keyed hash, in addition to their local --anonymize-labels.
	AnonymizeLabels []string `json:"anonymize_labels,omitempty" yaml:"anonymize_labels"`
	// MaxSeries caps, per selector (keyed by its exact text in Selectors),
	// the series a forwarder sends for it per cycle.
	MaxSeries map[string]int `json:"max_series,omitempty" yaml:"max_series"`
	// MinForwarderVersion, if set, is the lowest forwarder version
	// (MAJOR.MINOR.PATCH) that may apply this definition; older forwarders
	// keep their previous one.
	MinForwarderVersion string `json:"min_forwarder_version,omitempty" yaml:"min_forwarder_version"`
}

var versionRE = regexp.MustCompile(`^[A-Za-z0-9._:+-]+$`)

// Decode strictly decodes a JSON definition as served by the receiver: at
// most MaxBytes, no unknown fields, no trailing data, then Validate.
func Decode(b []byte) (*Definition, error) {
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(b), MaxBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d Definition
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the document", ErrMalformed)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// DecodeYAML strictly decodes the YAML file operators edit (same fields as
// the JSON document), then Validate.
func DecodeYAML(b []byte) (*Definition, error) {
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(b), MaxBytes)
	}
	var d Definition
	if err := strictyaml.Decode(b, &d); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("empty document")
		}
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// Validate reports every problem, each with its field, wrapped in
// ErrInvalid or ErrTooLarge.
func (d *Definition) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch {
	case d.Version == "":
		bad("version: required")
	case len(d.Version) > MaxVersionLength:
		bad("version: longer than %d", MaxVersionLength)
	case !versionRE.MatchString(d.Version):
		bad("version %q: want [A-Za-z0-9._:+-]", d.Version)
	}
	if len(d.Selectors) > MaxSelectors {
		return fmt.Errorf("%w: %d selectors, limit %d", ErrTooLarge, len(d.Selectors), MaxSelectors)
	}
	if len(d.AnonymizeLabels) > MaxAnonymizeLabels {
		return fmt.Errorf("%w: %d anonymize_labels, limit %d", ErrTooLarge, len(d.AnonymizeLabels), MaxAnonymizeLabels)
	}
	if len(d.Selectors) == 0 {
		bad("selectors: at least one is required")
	}
	seen := make(map[string]bool, len(d.Selectors))
	for i, s := range d.Selectors {
		if len(s) > MaxSelectorLength {
			bad("selectors[%d]: longer than %d", i, MaxSelectorLength)
			continue
		}
		if seen[s] {
			bad("selectors[%d] %q: duplicate", i, s)
		}
		seen[s] = true
		if _, err := allowlist.Parse([]string{s}); err != nil {
			bad("selectors[%d]: %v", i, err)
		}
	}
	names := make(map[string]bool, len(d.AnonymizeLabels))
	for i, n := range d.AnonymizeLabels {
		switch {
		case !model.LegacyValidation.IsValidLabelName(n):
			bad("anonymize_labels[%d] %q: not a label name", i, n)
		case n == model.MetricNameLabel || n == "_id" || n == "version":
			bad("anonymize_labels[%d] %q: cannot be anonymized", i, n)
		case names[n]:
			bad("anonymize_labels[%d] %q: duplicate", i, n)
		}
		names[n] = true
	}
	for _, s := range slices.Sorted(maps.Keys(d.MaxSeries)) {
		switch n := d.MaxSeries[s]; {
		case !seen[s]:
			bad("max_series[%q]: not one of the selectors", s)
		case n <= 0 || n > MaxSeriesCapPerRule:
			bad("max_series[%q]: %d, want 1..%d", s, n, MaxSeriesCapPerRule)
		}
	}
	if v := d.MinForwarderVersion; v != "" {
		if _, err := parseVersion(v); err != nil {
			bad("min_forwarder_version %q: %v", v, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
}

// Encode returns the canonical JSON of d (map keys sorted, no insignificant
// space), the body the receiver serves. Equal definitions encode equally.
func (d *Definition) Encode() []byte {
	b, err := json.Marshal(d)
	if err != nil { // only strings, slices and a map of ints: cannot happen
		panic(fmt.Sprintf("encode gathering definition: %v", err))
	}
	return b
}

// ETag is the strong entity tag of an encoded definition: a quoted digest
// of its bytes.
func ETag(body []byte) string {
	sum := sha256.Sum256(body)
	return `"` + hex.EncodeToString(sum[:16]) + `"`
}

// Allows reports whether a forwarder of version have may apply d. An
// unparsable have (a development build) is allowed.
func (d *Definition) Allows(have string) error {
	if d.MinForwarderVersion == "" {
		return nil
	}
	h, err := parseVersion(have)
	if err != nil {
		return nil
	}
	want, _ := parseVersion(d.MinForwarderVersion)
	if slices.Compare(h[:], want[:]) < 0 {
		return fmt.Errorf("definition %s needs forwarder %s or newer, this is %s", d.Version, d.MinForwarderVersion, have)
	}
	return nil
}

// parseVersion parses [v]MAJOR.MINOR.PATCH; a pre-release or build
// suffix (after "-" or "+") is ignored.
func parseVersion(v string) ([3]int, error) {
	var out [3]int
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return out, errors.New("want MAJOR.MINOR.PATCH")
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || len(p) > 9 {
			return out, errors.New("want MAJOR.MINOR.PATCH")
		}
		out[i] = n
	}
	return out, nil
}

// Compiled is a validated definition with its selectors compiled, its
// canonical body and ETag. Immutable.
type Compiled struct {
	Def   *Definition
	Allow *allowlist.List
	// Caps are the per-selector series caps, in selector order.
	Caps []Cap
	Body []byte
	ETag string
}

// Cap limits the series one selector lets through per cycle.
type Cap struct {
	Selector string
	Allow    *allowlist.List // the one selector
	Max      int
}

// Compile compiles a validated definition.
func Compile(d *Definition) (*Compiled, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	al, err := allowlist.Parse(d.Selectors)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c := &Compiled{Def: d, Allow: al, Body: d.Encode()}
	c.ETag = ETag(c.Body)
	for _, s := range d.Selectors {
		if n, ok := d.MaxSeries[s]; ok {
			one, err := allowlist.Parse([]string{s})
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
			}
			c.Caps = append(c.Caps, Cap{Selector: s, Allow: one, Max: n})
		}
	}
	return c, nil
}
