// Package fleet simulates a fleet of clusters that send telemetry over
// Prometheus remote-write 1.0, and measures how a receiver copes.
//
// The series of every simulated cluster have the shape of one real cluster's
// telemetry: the allowlisted series of a /federate response (see
// testdata/federate-sample.prom). A Fleet derives N clusters × M series from
// those templates deterministically from a seed; Run sends one point per
// series per round and records latency and status codes.
package fleet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/prometheus/common/model"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/promql/parser"
)

// ClusterLabel is the label that carries the (pseudonymous) cluster id.
const ClusterLabel = "_id"

// Template is one series shape taken from a /federate response.
type Template struct {
	Labels labels.Labels // including __name__ and _id (replaced per cluster)
	Value  float64       // the value in the fixture, the base for generated values
	// OffsetMs is the sub-second part of the fixture's timestamp. Series of one
	// scrape target share it, as they share a scrape timestamp in reality.
	OffsetMs int64
	Counter  bool // a monotonically increasing counter (name ends in _total)
}

// ParseSelectors reads an allowlist file: one PromQL series selector per
// line; blank lines and lines starting with '#' are ignored.
func ParseSelectors(r io.Reader) ([][]*labels.Matcher, error) {
	p := parser.NewParser(parser.Options{})
	var (
		out  [][]*labels.Matcher
		errs []error
	)
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ms, err := p.ParseMetricSelector(line)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d %q: %w", n, line, err))
			continue
		}
		out = append(out, ms)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// LoadTemplates parses a Prometheus text exposition (a /federate response)
// and returns the series that match at least one selector, in input order.
// With no selectors every series is kept.
func LoadTemplates(exposition []byte, selectors [][]*labels.Matcher) ([]Template, error) {
	p := textparse.NewPromParser(exposition, labels.NewSymbolTable(), false)
	var out []Template
	for {
		e, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("parse exposition: %w", err)
		}
		if e != textparse.EntrySeries {
			continue
		}
		var ls labels.Labels
		p.Labels(&ls)
		_, ts, v := p.Series()
		if len(selectors) > 0 && !matchesAny(selectors, ls) {
			continue
		}
		t := Template{
			Labels:  ls,
			Value:   v,
			Counter: strings.HasSuffix(ls.Get(model.MetricNameLabel), "_total"),
		}
		if ts != nil {
			t.OffsetMs = *ts % 1000
		}
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, errors.New("no series selected from the exposition")
	}
	return out, nil
}

func matchesAny(selectors [][]*labels.Matcher, ls labels.Labels) bool {
	for _, sel := range selectors {
		ok := true
		for _, m := range sel {
			if !m.Matches(ls.Get(m.Name)) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// LoadTemplateFiles is LoadTemplates over two files' contents; allowlist may be nil.
func LoadTemplateFiles(exposition, allowlist []byte) ([]Template, error) {
	var sel [][]*labels.Matcher
	if allowlist != nil {
		var err error
		if sel, err = ParseSelectors(bytes.NewReader(allowlist)); err != nil {
			return nil, err
		}
	}
	return LoadTemplates(exposition, sel)
}
