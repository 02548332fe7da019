package receive

import (
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/gathering"
)

func TestPolicyWithGathering(t *testing.T) {
	mustList := func(sel ...string) *allowlist.List {
		l, err := allowlist.Parse(sel)
		require.NoError(t, err)
		return l
	}
	series := func(name string) []prompb.Label { return []prompb.Label{{Name: "__name__", Value: name}} }
	var sb labels.ScratchBuilder
	base, err := NewPolicy(&Config{Allowlist: []string{"static_metric"}})
	require.NoError(t, err)
	open, err := NewPolicy(&Config{})
	require.NoError(t, err)

	for _, tc := range []struct {
		name      string
		p         *Policy
		allowed   []string
		forbidden []string
	}{
		{"no definition, no allowlist", open, []string{"anything"}, nil},
		{"definition only", open.WithGathering(mustList("cur"), nil, time.Time{}),
			[]string{"cur", gathering.InfoMetric}, []string{"anything", "static_metric"}},
		{"definition and config allowlist", base.WithGathering(mustList("cur"), nil, time.Time{}),
			[]string{"cur", "static_metric", gathering.InfoMetric}, []string{"anything"}},
		{"previous within grace", open.WithGathering(mustList("cur"), mustList("old"), time.Now().Add(time.Hour)),
			[]string{"cur", "old"}, []string{"anything"}},
		{"previous after grace", open.WithGathering(mustList("cur"), mustList("old"), time.Now().Add(-time.Second)),
			[]string{"cur"}, []string{"old"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range tc.allowed {
				require.True(t, tc.p.allows(series(n), &sb), n)
			}
			for _, n := range tc.forbidden {
				require.False(t, tc.p.allows(series(n), &sb), n)
			}
		})
	}
}
