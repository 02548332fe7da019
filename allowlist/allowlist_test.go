package allowlist

import (
	"os"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/stretchr/testify/require"
)

func fixtureSelectors(t testing.TB) []string {
	t.Helper()
	f, err := os.Open("../bench/testdata/telemetry-allowlist.txt") // one copy of the fixtures, in bench/testdata
	require.NoError(t, err)
	defer f.Close()
	sel, err := ReadSelectors(f)
	require.NoError(t, err)
	return sel
}

// fixtureSeries parses the federate fixture with Prometheus' own text parser.
func fixtureSeries(t testing.TB) []labels.Labels {
	t.Helper()
	b, err := os.ReadFile("../bench/testdata/federate-sample.prom")
	require.NoError(t, err)
	p, err := textparse.New(b, "text/plain; version=0.0.4", labels.NewSymbolTable(), textparse.ParserOptions{})
	require.NoError(t, err)
	var out []labels.Labels
	for {
		e, err := p.Next()
		if err != nil {
			require.EqualError(t, err, "EOF")
			break
		}
		if e != textparse.EntrySeries {
			continue
		}
		var ls labels.Labels
		p.Labels(&ls)
		out = append(out, ls)
	}
	return out
}

func TestFixtureAllowlist(t *testing.T) {
	sel := fixtureSelectors(t)
	require.Len(t, sel, 211)
	l, err := Parse(sel)
	require.NoError(t, err)
	require.Equal(t, 211, l.Len())
	require.Equal(t, sel, l.Selectors())

	series := fixtureSeries(t)
	require.Len(t, series, 300)
	allowed := 0
	for _, ls := range series {
		if l.Allows(ls) {
			allowed++
		}
	}
	require.Equal(t, 224, allowed)
}

func TestAllows(t *testing.T) {
	l, err := Parse([]string{
		`{__name__="ALERTS",alertstate="firing",severity=~"critical|warning|info|none"}`,
		`{__name__=~"cluster:usage:.*"}`,
		`up{job="node"}`,
		`{job="x", __name__!="y"}`,
	})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		ls   labels.Labels
		want bool
	}{
		{"alert firing", labels.FromStrings("__name__", "ALERTS", "alertstate", "firing", "severity", "warning"), true},
		{"alert pending", labels.FromStrings("__name__", "ALERTS", "alertstate", "pending", "severity", "warning"), false},
		{"alert moderate", labels.FromStrings("__name__", "ALERTS", "alertstate", "firing", "severity", "moderate"), false},
		{"regex name", labels.FromStrings("__name__", "cluster:usage:pods"), true},
		{"regex name anchored", labels.FromStrings("__name__", "x_cluster:usage:pods"), false},
		{"shorthand name", labels.FromStrings("__name__", "up", "job", "node"), true},
		{"shorthand wrong job", labels.FromStrings("__name__", "up", "job", "other"), false},
		{"no fixed name", labels.FromStrings("__name__", "z", "job", "x"), true},
		{"no fixed name negated", labels.FromStrings("__name__", "y", "job", "x"), false},
		{"empty", labels.EmptyLabels(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, l.Allows(tc.ls))
		})
	}
}

func TestZeroAndNilAllowNothing(t *testing.T) {
	var nilList *List
	require.False(t, nilList.Allows(labels.FromStrings("__name__", "up")))
	l, err := Parse(nil)
	require.NoError(t, err)
	require.False(t, l.Allows(labels.FromStrings("__name__", "up")))
}

func TestParseReportsEveryError(t *testing.T) {
	_, err := Parse([]string{`up`, `up{`, `ok{a="b"}`, `{}`, `rate(x[5m])`, `{a=~".*"}`})
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{`allowlist[1] "up{"`, `allowlist[3] "{}"`, `allowlist[4] "rate(x[5m])"`, `allowlist[5]`} {
		require.Contains(t, msg, want)
	}
	require.NotContains(t, msg, "allowlist[0]")
	require.NotContains(t, msg, "allowlist[2]")
}

func TestReadSelectors(t *testing.T) {
	in := "# comment\n\n  up  \n\t# indented comment\n{a=\"b\"}\n"
	got, err := ReadSelectors(strings.NewReader(in))
	require.NoError(t, err)
	require.Equal(t, []string{"up", `{a="b"}`}, got)

	l, err := ParseReader(strings.NewReader(in))
	require.NoError(t, err)
	require.Equal(t, 2, l.Len())
}

func FuzzAllowlistParse(f *testing.F) {
	for _, s := range fixtureSelectors(f) {
		f.Add(s)
	}
	for _, s := range []string{`up`, `up{`, `{}`, `{a=~"("}`, `{__name__=~".+"}`, `x{a!~"b|c",d=""}`, "\x00", `{"utf8.name"}`} {
		f.Add(s)
	}
	probe := []labels.Labels{
		labels.FromStrings("__name__", "up", "job", "node"),
		labels.FromStrings("__name__", "ALERTS", "alertstate", "firing", "severity", "warning"),
		labels.EmptyLabels(),
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := Parse([]string{s})
		if err != nil {
			require.Contains(t, err.Error(), "allowlist[0]")
			return
		}
		require.Equal(t, 1, l.Len())
		for _, ls := range probe {
			_ = l.Allows(ls) // must not panic
		}
	})
}
