package forward

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/relabel"
)

func labelOf(ts prompb.TimeSeries, name string) string {
	for _, l := range ts.Labels {
		if l.Name == name {
			return l.Value
		}
	}
	return ""
}

func namesOf(series []prompb.TimeSeries) map[string]int {
	out := map[string]int{}
	for _, ts := range series {
		out[labelOf(ts, "__name__")]++
	}
	return out
}

func definitionPolicy(t *testing.T, doc string, anonymize ...string) Policy {
	t.Helper()
	d, err := gathering.Decode([]byte(doc))
	require.NoError(t, err)
	c, err := gathering.Compile(d)
	require.NoError(t, err)
	rules, err := relabel.Parse(relabel.Config{
		ID: fixtureID, Salt: []byte(fixtureSalt), AnonymizeLabels: append(anonymize, d.AnonymizeLabels...),
	})
	require.NoError(t, err)
	return Policy{Allow: c.Allow, Rules: rules, Caps: c.Caps, DefinitionVersion: d.Version}
}

// A new policy applies to the next cycle whole: federation match[], the
// allowlist, anonymization, caps and the info series.
func TestSetPolicySwapsForNextCycle(t *testing.T) {
	fixture := readFixture(t, "federate-sample.prom")
	var (
		mu      sync.Mutex
		matches [][]string
	)
	inner := fakePrometheus(t, fixture, false)
	prom := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		matches = append(matches, r.URL.Query()["match[]"])
		mu.Unlock()
		http.Redirect(w, r, inner.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	t.Cleanup(prom.Close)
	recv := newFakeReceiver(t)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{}, FederateOptions{})

	require.NoError(t, h.f.Collect(context.Background()))
	h.deliverAll(t)
	require.Len(t, recv.series(), 224, "the initial (local) policy")
	require.Zero(t, namesOf(recv.series())[gathering.InfoMetric], "no info series without a definition")

	require.NoError(t, h.f.SetPolicy(definitionPolicy(t,
		`{"version":"v7","selectors":["cluster_version","up"],"anonymize_labels":["namespace"],"max_series":{"up":5}}`)))
	recv.mu.Lock()
	recv.reqs = nil
	recv.mu.Unlock()
	require.NoError(t, h.f.Collect(context.Background()))
	h.deliverAll(t)

	got := recv.series()
	names := namesOf(got)
	require.Equal(t, 4, names["cluster_version"])
	require.Equal(t, 5, names["up"], "capped at 5 of 17")
	require.Equal(t, 1, names[gathering.InfoMetric])
	require.Len(t, got, 4+5+1)
	for _, ts := range got {
		require.Equal(t, hashedID, labelOf(ts, "_id"))
		switch labelOf(ts, "__name__") {
		case "cluster_version":
			require.Equal(t, relabel.Anonymize([]byte(fixtureSalt), "openshift-cluster-version"), labelOf(ts, "namespace"), "anonymized as the definition says")
		case gathering.InfoMetric:
			require.Equal(t, "v7", labelOf(ts, "version"))
			require.Equal(t, 1.0, ts.Samples[0].Value)
		}
	}
	require.Equal(t, 12.0, testutil.ToFloat64(h.f.m.dropped.WithLabelValues(ReasonSelectorCap)))
	mu.Lock()
	require.Equal(t, []string{"cluster_version", "up"}, matches[len(matches)-1], "federation uses the new selectors")
	mu.Unlock()

	require.Error(t, h.f.SetPolicy(Policy{}), "a half policy is refused")
}

func TestCollectWithoutPolicyRunsNothing(t *testing.T) {
	q, err := OpenQueue(t.TempDir(), discardLogger(), nil, QueueOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	fetched := false
	src := sourceFunc(func(context.Context, func(*Sample) error) (FetchStats, error) {
		fetched = true
		return FetchStats{}, nil
	})
	f := New(discardLogger(), prometheus.NewRegistry(), src, Policy{}, q, nil, Options{})
	require.ErrorIs(t, f.Collect(context.Background()), ErrNoPolicy)
	require.False(t, fetched)
	al, err := allowlist.Parse([]string{"up"})
	require.NoError(t, err)
	rules, err := relabel.Parse(relabel.Config{ID: fixtureID, Salt: []byte(fixtureSalt)})
	require.NoError(t, err)
	require.NoError(t, f.SetPolicy(Policy{Allow: al, Rules: rules}))
	require.NoError(t, f.Collect(context.Background()))
	require.True(t, fetched)
}

type sourceFunc func(context.Context, func(*Sample) error) (FetchStats, error)

func (s sourceFunc) Fetch(ctx context.Context, fn func(*Sample) error) (FetchStats, error) {
	return s(ctx, fn)
}
