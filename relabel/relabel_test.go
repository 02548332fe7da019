package relabel

import (
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	promrelabel "github.com/prometheus/prometheus/model/relabel"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const (
	testSalt = "0123456789abcdef-salt"
	testID   = "5f6c2a9e-3b1d-4c7e-9a0f-2d8e4b6c1a73"
)

// Vectors computed independently with Python:
// base64.urlsafe_b64encode(hmac.new(salt, value, sha256).digest()[:16]).rstrip(b"=").
func TestAnonymizeVectors(t *testing.T) {
	for _, tc := range []struct{ salt, value, want string }{
		{testSalt, testID, "sUTqYf4UzU0SdM5NcdUhdA"},
		{testSalt, "openshift-cnv", "hVORBmLQ2Z-FFpYpQ0owtQ"},
		{"another-salt-of-16b", testID, "GwzjGMXm2Eo0n88Xda-s4w"},
		{testSalt, "", "aa9KZpCXHMObVepIBlWLEg"},
	} {
		require.Equal(t, tc.want, Anonymize([]byte(tc.salt), tc.value), "%q/%q", tc.salt, tc.value)
	}
	r, err := Parse(Config{ID: testID, Salt: []byte(testSalt)})
	require.NoError(t, err)
	require.Equal(t, "sUTqYf4UzU0SdM5NcdUhdA", r.HashedID())
	require.Equal(t, "hVORBmLQ2Z-FFpYpQ0owtQ", r.Hash("openshift-cnv"))
}

func mustConfigs(t *testing.T, y string) []*promrelabel.Config {
	t.Helper()
	var cs []*promrelabel.Config
	require.NoError(t, yaml.Unmarshal([]byte(y), &cs))
	return cs
}

func TestApply(t *testing.T) {
	r, err := Parse(Config{
		ID:              testID,
		Salt:            []byte(testSalt),
		AnonymizeLabels: []string{"namespace", "missing"},
		Rename:          map[string]string{"ALERTS": "alerts"},
		ExternalLabels:  map[string]string{"region": "eu"},
		RelabelConfigs: mustConfigs(t, `
- action: labeldrop
  regex: prometheus_replica
- action: drop
  source_labels: [__name__]
  regex: secret_.*
- source_labels: [_id]
  target_label: copied_id
`),
	})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		in   labels.Labels
		want labels.Labels // empty: dropped
	}{
		{
			name: "fixture alert",
			in: labels.FromStrings("__name__", "ALERTS", "alertname", "Watchdog", "namespace", "openshift-cnv",
				"_id", testID, "prometheus_replica", "prometheus-k8s-0", "region", "us"),
			want: labels.FromStrings("__name__", "alerts", "alertname", "Watchdog", "namespace", "hVORBmLQ2Z-FFpYpQ0owtQ",
				"_id", "sUTqYf4UzU0SdM5NcdUhdA", "copied_id", "sUTqYf4UzU0SdM5NcdUhdA", "region", "eu"),
		},
		{
			name: "raw id scrubbed from any value",
			in:   labels.FromStrings("__name__", "up", "cluster", "id="+testID+"!", "other", testID),
			want: labels.FromStrings("__name__", "up", "cluster", "id=sUTqYf4UzU0SdM5NcdUhdA!", "other", "sUTqYf4UzU0SdM5NcdUhdA",
				"_id", "sUTqYf4UzU0SdM5NcdUhdA", "copied_id", "sUTqYf4UzU0SdM5NcdUhdA", "region", "eu"),
		},
		{
			name: "dropped by relabel",
			in:   labels.FromStrings("__name__", "secret_x"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lb := labels.NewBuilder(tc.in)
			keep := r.Apply(lb)
			if tc.want.IsEmpty() {
				require.False(t, keep)
				return
			}
			require.True(t, keep)
			require.Equal(t, tc.want.String(), lb.Labels().String())
		})
	}
}

func TestRelabelCannotForgeID(t *testing.T) {
	r, err := Parse(Config{ID: testID, Salt: []byte(testSalt), RelabelConfigs: mustConfigs(t, `
- target_label: _id
  replacement: forged
`)})
	require.NoError(t, err)
	lb := labels.NewBuilder(labels.FromStrings("__name__", "up"))
	require.True(t, r.Apply(lb))
	require.Equal(t, "sUTqYf4UzU0SdM5NcdUhdA", lb.Get("_id"))
}

func TestNoIDLeavesLabelsAlone(t *testing.T) {
	r, err := Parse(Config{})
	require.NoError(t, err)
	in := labels.FromStrings("__name__", "up", "_id", "x")
	lb := labels.NewBuilder(in)
	require.True(t, r.Apply(lb))
	require.Equal(t, in, lb.Labels())
}

func TestDroppedWhenNameRemoved(t *testing.T) {
	r, err := Parse(Config{RelabelConfigs: mustConfigs(t, `
- action: labeldrop
  regex: __name__
`)})
	require.NoError(t, err)
	require.False(t, r.Apply(labels.NewBuilder(labels.FromStrings("__name__", "up"))))
}

func TestParseReportsEveryProblem(t *testing.T) {
	_, err := Parse(Config{
		ID:              "x",
		Salt:            []byte("short"),
		AnonymizeLabels: []string{"ok", "__name__", ""},
		Rename:          map[string]string{"a": ""},
		ExternalLabels:  map[string]string{"_id": "x", "e": ""},
		RelabelConfigs:  []*promrelabel.Config{nil, {Action: promrelabel.Replace, Regex: promrelabel.MustNewRegexp("(.*)")}},
	})
	require.Error(t, err)
	for _, want := range []string{
		"anonymize salt: 5 bytes",
		`anonymize_labels[1] "__name__"`,
		`anonymize_labels[2] ""`,
		`rename "a"=""`,
		`label "_id": reserved`,
		`label "e": empty value`,
		"relabel_configs[0]: empty",
		"relabel_configs[1]: relabel configuration for replace action requires 'target_label' value",
	} {
		require.Contains(t, err.Error(), want)
	}
}

func TestRulesDoNotAliasConfig(t *testing.T) {
	c := Config{ID: testID, Salt: []byte(testSalt), AnonymizeLabels: []string{"a"}, Rename: map[string]string{"x": "y"}}
	r, err := Parse(c)
	require.NoError(t, err)
	c.Salt[0] = 'X'
	c.AnonymizeLabels[0] = "b"
	c.Rename["x"] = "z"
	lb := labels.NewBuilder(labels.FromStrings("__name__", "x", "a", "openshift-cnv"))
	require.True(t, r.Apply(lb))
	require.Equal(t, "y", lb.Get("__name__"))
	require.Equal(t, "hVORBmLQ2Z-FFpYpQ0owtQ", lb.Get("a"))
}

func BenchmarkApply(b *testing.B) {
	r, err := Parse(Config{ID: testID, Salt: []byte(testSalt), AnonymizeLabels: []string{"namespace"},
		Rename: map[string]string{"ALERTS": "alerts"}, ExternalLabels: map[string]string{"region": "eu"}})
	require.NoError(b, err)
	in := labels.FromStrings("__name__", "ALERTS", "alertname", "Watchdog", "namespace", "openshift-cnv", "_id", testID)
	lb := labels.NewBuilder(labels.EmptyLabels())
	b.ReportAllocs()
	for b.Loop() {
		lb.Reset(in)
		if !r.Apply(lb) {
			b.Fatal("dropped")
		}
	}
}

func TestScrubTextHidesTheRawID(t *testing.T) {
	r, err := Parse(Config{ID: testID, Salt: []byte(testSalt)})
	require.NoError(t, err)
	got := r.ScrubText("Help mentioning " + testID + " twice: " + testID)
	require.NotContains(t, got, testID)
	require.Contains(t, got, r.HashedID())
	require.Equal(t, "no id here", r.ScrubText("no id here"))
	none, err := Parse(Config{})
	require.NoError(t, err)
	require.Equal(t, "x", none.ScrubText("x"))
}

func TestAnonymizedValueIsScrubbedFromOtherLabels(t *testing.T) {
	r, err := Parse(Config{Salt: []byte(testSalt), AnonymizeLabels: []string{"host"}})
	require.NoError(t, err)
	lb := labels.NewBuilder(labels.FromStrings("__name__", "up", "host", "node-a.corp", "instance", "node-a.corp:9100", "short", "x"))
	require.True(t, r.Apply(lb))
	ls := lb.Labels()
	require.Equal(t, r.Hash("node-a.corp"), ls.Get("host"))
	require.Equal(t, r.Hash("node-a.corp")+":9100", ls.Get("instance"), "the raw value does not leave inside another label")
	require.NotContains(t, ls.String(), "node-a.corp")
}
