package main

import (
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
)

// TestElideLabelFlag: telemeter-client's --elide-label, a pflag
// StringArray: one name per value, the default replaced when given.
func TestElideLabelFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"default", nil, []string{"prometheus", "prometheus_replica"}},
		{"given replaces the default", []string{"--elide-label=replica"}, []string{"replica"}},
		{"repeatable", []string{"--elide-label=a", "--elide-label", "b"}, []string{"a", "b"}},
		{"not comma-split", []string{"--elide-label=a,b"}, []string{"a,b"}},
		{"empty elides nothing", []string{"--elide-label="}, nil},
		{"empty values skipped", []string{"--elide-label=", "--elide-label=b"}, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseFlags(tc.args, io.Discard)
			require.NoError(t, err)
			require.Equal(t, tc.want, elidedLabels(f))
		})
	}

	rule, err := elideRule(nil)
	require.NoError(t, err)
	require.Nil(t, rule, "nothing to elide: no rule")
	_, err = elideRule([]string{"__name__", "_id", "\xff", "ok"})
	for _, want := range []string{
		`--elide-label "__name__": the metric name cannot be elided`,
		`--elide-label "_id": the cluster pseudonym cannot be elided`,
		`--elide-label "\xff": invalid label name`,
	} {
		require.ErrorContains(t, err, want)
	}
	require.NotContains(t, err.Error(), `"ok"`)
}

// TestElideLabelPolicy: the elided labels leave every series after
// --label and relabel_configs (which still see them) and before
// anonymization; --elide-label= keeps them.
func TestElideLabelPolicy(t *testing.T) {
	salt := writeFile(t, "salt", "0123456789abcdef-salt\n")
	// Keeps one replica's series: the file's rules read the label.
	cfg := writeFile(t, "forwarder.yaml", `relabel_configs:
  - source_labels: [prometheus_replica]
    regex: prometheus-k8s-0
    action: keep
`)
	apply := func(t *testing.T, ls labels.Labels, extra ...string) (labels.Labels, bool) {
		t.Helper()
		f, err := parseFlags(append([]string{
			"--to=http://127.0.0.1:1", "--from=http://127.0.0.1:2", "--id=abc", "--match=up",
			"--anonymize-salt-file=" + salt, "--config.file=" + cfg,
			"--label=prometheus=re-added", "--anonymize-labels=prometheus_replica,namespace",
		}, extra...), io.Discard)
		require.NoError(t, err)
		s, err := load(f, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		lb := labels.NewBuilder(ls)
		keep := s.policy.Rules.Apply(lb)
		return lb.Labels(), keep
	}
	replica := func(r string) labels.Labels {
		return labels.FromStrings("__name__", "up", "namespace", "ns", "prometheus", "openshift-monitoring/k8s", "prometheus_replica", r)
	}

	got, keep := apply(t, replica("prometheus-k8s-0"))
	require.True(t, keep)
	require.Equal(t, []string{"__name__", "_id", "namespace"}, labelNames(got), "both elided, also the --label one")
	require.NotEqual(t, "ns", got.Get("namespace"), "the other anonymized label is hashed")
	_, keep = apply(t, replica("prometheus-k8s-1"))
	require.False(t, keep, "relabel_configs read prometheus_replica before it is elided")

	got, keep = apply(t, replica("prometheus-k8s-0"), "--elide-label=")
	require.True(t, keep)
	require.Equal(t, "re-added", got.Get("prometheus"), "nothing elided: --label applies")
	require.NotEqual(t, "prometheus-k8s-0", got.Get("prometheus_replica"), "kept, and anonymized")
	require.NotEmpty(t, got.Get("prometheus_replica"))
}

func labelNames(ls labels.Labels) []string {
	var names []string
	ls.Range(func(l labels.Label) { names = append(names, l.Name) })
	return names
}
