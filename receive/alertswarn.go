package receive

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/phonehome/phonehome/gathering"
)

// telemeter-client and the forwarder rename ALERTS to alerts by default
// (--rename ALERTS=alerts): the receiver sees only the renamed series.
const (
	alertsName        = "ALERTS"
	renamedAlertsName = "alerts"
)

// UnrenamedAlerts returns the selectors of selectors (valid ones, as
// LoadConfig and gathering.Compile leave them) that select ALERTS, when
// neither selectors nor also admit the alerts series that clusters send
// in their place: such an allowlist drops every alert, counted only as
// reason="allowlist" (CMO's allowlist, pasted as it is, has ALERTS alone).
// A selector without a metric name admits both names. Nil when there is
// nothing to warn about.
func UnrenamedAlerts(selectors, also []string) []string {
	var onALERTS []string
	p := parser.NewParser(parser.Options{})
	for _, s := range selectors {
		ms, err := p.ParseMetricSelector(s)
		if err != nil {
			continue // reported by validation
		}
		if admitsName(ms, renamedAlertsName) {
			return nil
		}
		if namesMetric(ms) && admitsName(ms, alertsName) {
			onALERTS = append(onALERTS, s)
		}
	}
	if len(onALERTS) == 0 {
		return nil
	}
	for _, s := range also {
		if ms, err := p.ParseMetricSelector(s); err == nil && admitsName(ms, renamedAlertsName) {
			return nil
		}
	}
	return onALERTS
}

// admitsName reports whether every metric name matcher of ms matches name
// (true for a selector without one).
func admitsName(ms []*labels.Matcher, name string) bool {
	for _, m := range ms {
		if m.Name == model.MetricNameLabel && !m.Matches(name) {
			return false
		}
	}
	return true
}

// namesMetric reports whether ms has a metric name matcher.
func namesMetric(ms []*labels.Matcher) bool {
	for _, m := range ms {
		if m.Name == model.MetricNameLabel {
			return true
		}
	}
	return false
}

// WarnUnrenamedAlerts logs a warning for the allowlist of cfg and for each
// of its gathering definitions (loaded from their files; one that does not
// load is skipped, CheckFiles reports it) whose selectors drop every alert
// (UnrenamedAlerts), naming its YAML path. The receiver keeps a series that
// the allowlist or the tenant's definition selects, so each is judged
// together with the other: the allowlist with the default definition (the
// one of the tenants without their own), a definition with the allowlist.
// Run at start, under --check-config and at each configuration reload: a
// warning, never an error, since an allowlist may drop alerts on purpose.
func WarnUnrenamedAlerts(logger *slog.Logger, cfg *Config) {
	var def []string
	if cfg.Gathering.File != "" {
		if c, err := gathering.Load(cfg.Gathering.File); err == nil {
			def = c.Def.Selectors
			warnUnrenamedAlerts(logger, "gathering.file", def, cfg.Allowlist)
		}
	}
	for _, t := range slices.Sorted(maps.Keys(cfg.Gathering.Tenants)) {
		if c, err := gathering.Load(cfg.Gathering.Tenants[t]); err == nil {
			warnUnrenamedAlerts(logger, fmt.Sprintf("gathering.tenants[%q]", t), c.Def.Selectors, cfg.Allowlist)
		}
	}
	warnUnrenamedAlerts(logger, "allowlist", cfg.Allowlist, def)
}

func warnUnrenamedAlerts(logger *slog.Logger, where string, selectors, also []string) {
	if sel := UnrenamedAlerts(selectors, also); sel != nil {
		logger.Warn(`selectors select ALERTS but not alerts, the name telemeter-client and the forwarder send it under (--rename ALERTS=alerts, their default): every alert is dropped, counted only as reason="allowlist"; add the alerts form of each such selector, e.g. {__name__="alerts",...} next to {__name__="ALERTS",...}`,
			"in", where, "selectors", sel)
	}
}
