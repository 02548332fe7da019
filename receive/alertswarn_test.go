package receive

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestUnrenamedAlerts: an allowlist that selects ALERTS but nothing that
// admits alerts, the name clusters send it under, is found; one that
// admits alerts anywhere (also in the selectors enforced with it) is not.
func TestUnrenamedAlerts(t *testing.T) {
	cmo := `{__name__="ALERTS",alertstate="firing",severity=~"critical|warning|info|none"}`
	for _, tc := range []struct {
		name      string
		selectors []string
		also      []string
		want      []string
	}{
		{name: "CMO's pasted as is", selectors: []string{"up", cmo}, want: []string{cmo}},
		{name: "short form", selectors: []string{`ALERTS{alertstate="firing"}`}, want: []string{`ALERTS{alertstate="firing"}`}},
		{name: "regex naming ALERTS", selectors: []string{`{__name__=~"ALERTS|up"}`}, want: []string{`{__name__=~"ALERTS|up"}`}},
		{name: "both forms", selectors: []string{cmo, `{__name__="alerts",alertstate="firing"}`}},
		{name: "one regex for both", selectors: []string{`{__name__=~"ALERTS|alerts"}`}},
		{name: "alerts in the selectors enforced with it", selectors: []string{cmo}, also: []string{`alerts`}},
		{name: "no ALERTS", selectors: []string{"up", "cluster_version"}},
		{name: "no metric name admits both", selectors: []string{cmo, `{alertstate="firing"}`}},
		{name: "a name-less selector does not count as one on ALERTS", selectors: []string{`{alertstate="firing"}`}},
		{name: "state:rhoam_critical_alerts:max is another metric", selectors: []string{cmo, "state:rhoam_critical_alerts:max"}, want: []string{cmo}},
		{name: "empty allowlist", selectors: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, UnrenamedAlerts(tc.selectors, tc.also))
		})
	}
}

// TestUnrenamedAlertsWarnedAtReload: a reload that installs an allowlist
// dropping every alert logs a warning naming where and which selectors;
// the allowlist is applied all the same, and so is a definition's.
func TestUnrenamedAlertsWarnedAtReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "receiver.yaml")
	write := func(name, s string) { require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(s), 0o600)) }
	write("receiver.yaml", "allowlist: [up]\n")
	var log bytes.Buffer
	applied := 0
	r := NewConfigReloader(slog.New(slog.NewTextHandler(&log, nil)), prometheus.NewRegistry(), path, func(*Config) { applied++ })

	write("receiver.yaml", "allowlist: [up, 'ALERTS{alertstate=\"firing\"}']\n")
	require.NoError(t, r.Reload())
	require.Equal(t, 1, applied)
	require.Contains(t, log.String(), "level=WARN msg=\"selectors select ALERTS but not alerts")
	require.Contains(t, log.String(), `in=allowlist selectors="[ALERTS{alertstate=\"firing\"}]"`)

	log.Reset()
	write("default.yaml", "version: d1\nselectors: ['ALERTS', 'alerts']\n")
	write("acme.yaml", "version: a1\nselectors: ['ALERTS']\n")
	write("receiver.yaml", "allowlist: ['ALERTS{alertstate=\"firing\"}']\ngathering:\n  file: default.yaml\n  tenants: {acme: acme.yaml}\n")
	require.NoError(t, r.Reload())
	require.Equal(t, 2, applied)
	require.NotContains(t, log.String(), "in=allowlist", "the default definition admits alerts for the tenants the allowlist applies to alone")
	require.Contains(t, log.String(), `in="gathering.tenants[\"acme\"]" selectors=[ALERTS]`)
	require.NotContains(t, log.String(), "in=gathering.file")

	log.Reset()
	write("receiver.yaml", "allowlist: ['ALERTS{alertstate=\"firing\"}', 'alerts{alertstate=\"firing\"}']\n")
	require.NoError(t, r.Reload())
	require.NotContains(t, log.String(), "ALERTS but not alerts")
}
