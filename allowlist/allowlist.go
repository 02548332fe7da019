// Package allowlist decides which series may pass, from PromQL series selectors.
//
// It is pure: no I/O beyond reading an io.Reader the caller owns, no globals.
package allowlist

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/prometheus/common/model"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// List is a compiled, immutable allowlist. A series is allowed if it matches all
// matchers of at least one selector. The zero List allows nothing. Safe for
// concurrent use.
//
// Selectors with an equality matcher on the metric name are indexed by that
// name, so Allows costs one map lookup plus the few selectors of that metric
// (and the selectors that have no fixed name), not a scan of every selector.
type List struct {
	selectors []string                       // the source text, in input order
	byName    map[string][][]*labels.Matcher // selectors with __name__="x"
	other     [][]*labels.Matcher            // selectors without a fixed name
}

// ErrMatchesEverything rejects a selector whose matchers all match the empty
// string (`{}`, `{a=""}`, `{a=~".*"}`): it would allow every series. PromQL
// rejects the same selectors in queries.
var ErrMatchesEverything = errors.New("selector must contain at least one matcher that does not match the empty string")

// Parse compiles selectors such as `up{job="node"}`. It reports every invalid
// selector, prefixed with its index, not just the first. An empty input yields
// a List that allows nothing.
func Parse(selectors []string) (*List, error) {
	p := parser.NewParser(parser.Options{})
	l := &List{byName: make(map[string][][]*labels.Matcher)}
	var errs []error
	for i, s := range selectors {
		ms, err := p.ParseMetricSelector(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("allowlist[%d] %q: %w", i, s, err))
			continue
		}
		if matchesEmpty(ms) {
			errs = append(errs, fmt.Errorf("allowlist[%d] %q: %w", i, s, ErrMatchesEverything))
			continue
		}
		l.add(s, ms)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return l, nil
}

func matchesEmpty(ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches("") {
			return false
		}
	}
	return true
}

func (l *List) add(s string, ms []*labels.Matcher) {
	l.selectors = append(l.selectors, s)
	for _, m := range ms {
		if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
			l.byName[m.Value] = append(l.byName[m.Value], ms)
			return
		}
	}
	l.other = append(l.other, ms)
}

// ReadSelectors reads one selector per line from r. Blank lines and lines
// whose first non-space character is '#' are skipped; surrounding spaces are
// trimmed. It does not validate the selectors: pass the result to Parse.
func ReadSelectors(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read selectors: %w", err)
	}
	return out, nil
}

// ParseReader reads selectors with ReadSelectors and compiles them with Parse.
func ParseReader(r io.Reader) (*List, error) {
	sel, err := ReadSelectors(r)
	if err != nil {
		return nil, err
	}
	return Parse(sel)
}

// Selectors returns the source text of the compiled selectors, in input order,
// as they should be sent in /federate match[] parameters. The caller must not
// modify the returned slice.
func (l *List) Selectors() []string {
	if l == nil {
		return nil
	}
	return l.selectors
}

// Len returns the number of selectors.
func (l *List) Len() int { return len(l.Selectors()) }

// Allows reports whether ls matches any selector.
func (l *List) Allows(ls labels.Labels) bool { return l.AllowsFunc(ls.Get) }

// AllowsFunc is Allows for a series whose label values get returns ("" for
// a label it does not have), so callers holding labels in another form need
// not build a labels.Labels.
func (l *List) AllowsFunc(get func(name string) string) bool {
	if l == nil {
		return false
	}
	for _, sel := range l.byName[get(model.MetricNameLabel)] {
		if MatchesAll(sel, get) {
			return true
		}
	}
	for _, sel := range l.other {
		if MatchesAll(sel, get) {
			return true
		}
	}
	return false
}

// MatchesAll reports whether the label values get returns satisfy every
// matcher of sel: one selector, as PromQL applies it.
func MatchesAll(sel []*labels.Matcher, get func(string) string) bool {
	for _, m := range sel {
		if !m.Matches(get(m.Name)) {
			return false
		}
	}
	return true
}
