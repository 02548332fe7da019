package limits

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
)

func TestLabelLimits(t *testing.T) {
	cfg := Config{Defaults: Spec{
		MaxLabelNamesPerSeries: ptr(4),
		MaxLabelNameLength:     ptr(10),
		MaxLabelValueLength:    ptr(20),
	}}
	withLabels := func(n int) labels.Labels {
		b := labels.NewScratchBuilder(n)
		b.Add("__name__", "up")
		for i := 1; i < n; i++ {
			b.Add(string(rune('a'+i)), "v")
		}
		b.Sort()
		return b.Labels()
	}
	cases := []struct {
		name  string
		ls    labels.Labels
		limit string // "" = accepted
	}{
		{"names under", withLabels(3), ""},
		{"names at", withLabels(4), ""},
		{"names over", withLabels(5), LimitLabelNamesPerSeries},
		{"name length under", labels.FromStrings(strings.Repeat("n", 9), "v"), ""},
		{"name length at", labels.FromStrings(strings.Repeat("n", 10), "v"), ""},
		{"name length over", labels.FromStrings(strings.Repeat("n", 11), "v"), LimitLabelNameLength},
		{"value length under", labels.FromStrings("n", strings.Repeat("v", 19)), ""},
		{"value length at", labels.FromStrings("n", strings.Repeat("v", 20)), ""},
		{"value length over", labels.FromStrings("a", "ok", "n", strings.Repeat("v", 21)), LimitLabelValueLength},
		// An empty value means the label is absent: it is not stored, so
		// it counts for no limit.
		{"empty values do not count", labels.FromStrings("__name__", "up", "a", "", "b", "v", "c", "", "d", "v", "e", "v"), ""},
		{"names over, empty values aside", labels.FromStrings("__name__", "up", "a", "", "b", "v", "c", "v", "d", "v", "e", "v"), LimitLabelNamesPerSeries},
		{"a long name with an empty value", labels.FromStrings(strings.Repeat("n", 11), "", "a", "v"), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			l := New(reg, cfg, nil)
			s := l.Session("t", "c")
			for _, err := range []error{l.CheckLabels("t", tc.ls), s.CheckLabels(tc.ls)} {
				if tc.limit == "" {
					require.NoError(t, err)
					continue
				}
				var le *LimitError
				require.ErrorAs(t, err, &le)
				require.Equal(t, tc.limit, le.Limit)
				require.ErrorIs(t, err, ErrLabelLimit)
			}
			if tc.limit != "" {
				require.Equal(t, 2.0, rejected(t, reg, tc.limit))
			}
		})
	}

	l := New(nil, Config{Defaults: Spec{
		MaxLabelNamesPerSeries: ptr(0), MaxLabelNameLength: ptr(0), MaxLabelValueLength: ptr(0),
	}}, nil)
	require.NoError(t, l.CheckLabels("t", labels.FromStrings(strings.Repeat("n", 1000), strings.Repeat("v", 100000))), "0 = unlimited")
}

func TestSizeLimits(t *testing.T) {
	cfg := Config{Tenants: map[string]Spec{"acme": {
		MaxBodyBytes:    ptr(byteSize(1 << 10)),
		MaxDecodedBytes: ptr(byteSize(4 << 10)),
	}}}
	l := New(nil, cfg, nil)
	for _, tc := range []struct {
		name  string
		check func(string, int64) error
		max   int64
		limit string
	}{
		{"body", l.CheckBodyBytes, 1 << 10, LimitBodyBytes},
		{"decoded", l.CheckDecodedBytes, 4 << 10, LimitDecodedBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.check("acme", tc.max-1))
			require.NoError(t, tc.check("acme", tc.max))
			err := tc.check("acme", tc.max+1)
			require.Equal(t, &LimitError{Limit: tc.limit, Value: float64(tc.max)}, err)
			require.ErrorIs(t, err, ErrTooLarge)
			require.NoError(t, tc.check("other", tc.max+1), "other tenants keep the defaults")
		})
	}
}

func TestMetricsPreCreated(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg, Config{}, nil)
	require.Equal(t, len(limitNames()), testutil.CollectAndCount(reg, "phonehome_limits_rejected_total"))
	require.Equal(t, 1, testutil.CollectAndCount(reg, "phonehome_limits_tracked_series"))
	require.Equal(t, 1, testutil.CollectAndCount(reg, "phonehome_limits_expired_series_total"))
	for _, name := range limitNames() {
		require.NotNil(t, (&LimitError{Limit: name}).Unwrap(), name)
	}
}
