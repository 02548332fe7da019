package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/prometheus/common/model"
	promrelabel "github.com/prometheus/prometheus/model/relabel"

	"github.com/phonehome/phonehome/relabel"
)

// defaultElideLabels is telemeter-client's --elide-label default: the
// external labels the cluster's Prometheus adds to every federated series.
// They name the replica the Service reached, so keeping them would send
// each series once per replica over time.
func defaultElideLabels() []string { return []string{"prometheus", "prometheus_replica"} }

// elidedLabels are the label names --elide-label removes: the default
// unless the flag is given, else its non-empty values. Like
// telemeter-client's (a pflag StringArray), a value is one name, never a
// comma-separated list, and `--elide-label=` alone elides nothing.
func elidedLabels(f *flags) []string {
	if !f.set["elide-label"] {
		return defaultElideLabels()
	}
	var names []string
	for _, n := range f.elideLabels {
		if n != "" {
			names = append(names, n)
		}
	}
	return names
}

// elideRule is the labeldrop that removes names from every series (nil
// for none). load appends it to relabel_configs: it runs after --label,
// --rename and the file's rules (which may still read the labels, to keep
// one replica's series say) and before anonymization, so neither can put
// an elided label back. The metric name and _id cannot be elided.
func elideRule(names []string) (*promrelabel.Config, error) {
	var errs []error
	quoted := make([]string, 0, len(names))
	for _, n := range names {
		switch {
		case !model.UTF8Validation.IsValidLabelName(n):
			errs = append(errs, fmt.Errorf("--elide-label %q: invalid label name", n))
		case n == model.MetricNameLabel:
			errs = append(errs, fmt.Errorf("--elide-label %q: the metric name cannot be elided", n))
		case n == relabel.IDLabel:
			errs = append(errs, fmt.Errorf("--elide-label %q: the cluster pseudonym cannot be elided", n))
		}
		quoted = append(quoted, regexp.QuoteMeta(n))
	}
	if err := errors.Join(errs...); err != nil || len(names) == 0 {
		return nil, err
	}
	re, err := promrelabel.NewRegexp(strings.Join(quoted, "|"))
	if err != nil {
		return nil, fmt.Errorf("--elide-label: %w", err)
	}
	rule := promrelabel.DefaultRelabelConfig // labeldrop takes only a regex
	rule.Action, rule.Regex = promrelabel.LabelDrop, re
	return &rule, nil
}
