// Package deploy holds no Go code: its tests check the shipped rule files
// (with the real promtool, Debian package `prometheus`) and dashboards.
package deploy

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const promtool = "/usr/bin/promtool" // never skipped: CI installs it

// TestPromtoolRules checks every rule file and runs every promtool unit test;
// every rule file must be covered by at least one test file, and every alert
// by a scenario (an alert_rule_test) of a test file that loads it.
func TestPromtoolRules(t *testing.T) {
	ruleFiles := globs(t, "rules/*.yaml", "prometheus/*.yaml")
	testFiles := globs(t, "rules/tests/*.yaml", "prometheus/tests/*.yaml")
	require.NotEmpty(t, ruleFiles)

	out, err := exec.Command(promtool, append([]string{"check", "rules"}, ruleFiles...)...).CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)

	tested := map[string]map[string]bool{} // rule file -> alerts with a scenario
	for _, tf := range testFiles {
		b, err := os.ReadFile(tf)
		require.NoError(t, err)
		spec := parsePromtoolTests(t, tf, b)
		for _, rf := range spec.RuleFiles {
			rf = filepath.Clean(filepath.Join(filepath.Dir(tf), rf))
			if tested[rf] == nil {
				tested[rf] = map[string]bool{}
			}
			maps.Copy(tested[rf], spec.alerts())
		}
		t.Run(tf, func(t *testing.T) {
			out, err := exec.Command(promtool, "test", "rules", tf).CombinedOutput()
			require.NoError(t, err, "promtool test rules %s:\n%s", tf, out)
			require.Contains(t, string(out), "SUCCESS")
		})
	}
	for _, rf := range ruleFiles {
		scenarios, covered := tested[filepath.Clean(rf)]
		require.True(t, covered, "%s has no promtool unit test", rf)
		var alerts []string
		for _, r := range ruleFileAlerts(t, rf) {
			alerts = append(alerts, r.Alert)
		}
		require.Empty(t, withoutScenario(alerts, scenarios), "%s: alerts without a promtool scenario", rf)
	}
}

// promtoolTests is the part of a promtool unit-test file the tests read.
type promtoolTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func parsePromtoolTests(t *testing.T, name string, b []byte) promtoolTests {
	t.Helper()
	var spec promtoolTests
	require.NoError(t, yaml.Unmarshal(b, &spec), name)
	return spec
}

// alerts returns the alerts that a scenario (an alert_rule_test) evaluates.
func (p promtoolTests) alerts() map[string]bool {
	tested := map[string]bool{}
	for _, tc := range p.Tests {
		for _, a := range tc.AlertRuleTest {
			tested[a.Alertname] = true
		}
	}
	return tested
}

// withoutScenario returns the alerts that tested lacks: a new alert must
// come with a scenario that fires it.
func withoutScenario(alerts []string, tested map[string]bool) []string {
	var missing []string
	for _, a := range alerts {
		if !tested[a] {
			missing = append(missing, a)
		}
	}
	return missing
}

// alertRule is an alerting rule of a rule file.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Annotations map[string]string `yaml:"annotations"`
}

// ruleFileAlerts returns the alerting rules of a rule file.
func ruleFileAlerts(t *testing.T, ruleFile string) []alertRule {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile(ruleFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &f), ruleFile)
	var alerts []alertRule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r)
			}
		}
	}
	return alerts
}

// TestAlertsDocumented requires a summary, a description and a runbook_url
// pointing at a section of docs/rules.md for every alert.
func TestAlertsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/rules.md")
	require.NoError(t, err)
	for _, rf := range globs(t, "rules/*.yaml") {
		for _, r := range ruleFileAlerts(t, rf) {
			for _, k := range []string{"summary", "description", "runbook_url"} {
				require.NotEmpty(t, r.Annotations[k], "%s: alert %s has no %s", rf, r.Alert, k)
			}
			anchor := strings.ToLower(r.Alert)
			require.True(t, strings.HasSuffix(r.Annotations["runbook_url"], "docs/rules.md#"+anchor), "%s: runbook_url of %s", rf, r.Alert)
			require.Contains(t, string(doc), "\n### "+r.Alert+"\n", "docs/rules.md has no section for %s", r.Alert)
		}
	}
}

// TestAlertsHaveRunbookRows: every alert on our own components (the
// receiver's PrometheusRule, the forwarder's rule file) has a row in a
// runbook table of docs/operations.md, "What to watch".
func TestAlertsHaveRunbookRows(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	var alerts []string
	for _, r := range ruleFileAlerts(t, "prometheus/phonehome-forwarder.rules.yaml") {
		alerts = append(alerts, r.Alert)
	}
	for _, g := range readPrometheusRule(t, "kubernetes/monitoring/receiver-alerts.yaml").Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
		}
	}
	require.Greater(t, len(alerts), 20)
	for _, a := range alerts {
		require.True(t, strings.Contains(string(doc), "\n| `"+a+"` |"), "docs/operations.md has no runbook row for %s", a)
	}
}

func globs(t *testing.T, patterns ...string) []string {
	t.Helper()
	var out []string
	for _, p := range patterns {
		m, err := filepath.Glob(p)
		require.NoError(t, err)
		out = append(out, m...)
	}
	return out
}
