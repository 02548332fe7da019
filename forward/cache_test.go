package forward

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	promrelabel "github.com/prometheus/prometheus/model/relabel"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/relabel"
)

// switchablePrometheus serves whatever body holds, as text, or 500 when it is nil.
func switchablePrometheus(t *testing.T, body *atomic.Pointer[[]byte]) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		b := body.Load()
		if b == nil {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(*b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func newCacheTestForwarder(t *testing.T, promURL string, pol Policy, opts Options) (*Forwarder, *Queue) {
	t.Helper()
	q := openTestQueue(t, t.TempDir(), QueueOptions{MaxBytes: 64 << 20})
	src := NewFederator(mustURL(t, promURL), http.DefaultClient, FederateOptions{Matches: pol.Allow.Selectors()})
	return New(discardLogger(), nil, src, pol, q, nil, opts), q
}

// queuedSeries pops every queued record and returns its series as sorted
// strings (labels, value, timestamp, metadata), with the uncompressed
// request bytes.
func queuedSeries(t *testing.T, q *Queue) ([]string, [][]byte) {
	t.Helper()
	var (
		out []string
		raw [][]byte
	)
	for _, p := range drain(t, q) {
		rec, err := decodePayload([]byte(p))
		require.NoError(t, err)
		body, err := snappy.Decode(nil, rec.Body)
		require.NoError(t, err)
		raw = append(raw, body)
		req, err := rec.toV1()
		require.NoError(t, err)
		for _, ts := range req.Timeseries {
			out = append(out, seriesString(ts))
		}
		for _, m := range req.Metadata {
			out = append(out, fmt.Sprintf("meta %s %v %q %q", m.MetricFamilyName, m.Type, m.Help, m.Unit))
		}
	}
	sort.Strings(out)
	return out, raw
}

func seriesString(ts prompb.TimeSeries) string {
	var b strings.Builder
	for _, l := range ts.Labels {
		fmt.Fprintf(&b, "%s=%q,", l.Name, l.Value)
	}
	for _, s := range ts.Samples {
		fmt.Fprintf(&b, " %v@%d", s.Value, s.Timestamp)
	}
	return b.String()
}

// cachePolicy exercises every per-series decision: the allowlist, a
// per-selector cap, a relabel drop, a rename, anonymized labels and _id.
func cachePolicy(t *testing.T, salt string) Policy {
	t.Helper()
	base := fixturePolicy(t)
	capList, err := allowlist.Parse([]string{`cluster_operator_conditions`})
	require.NoError(t, err)
	rules, err := relabel.Parse(relabel.Config{
		ID: fixtureID, Salt: []byte(salt), Rename: map[string]string{"ALERTS": "alerts"},
		AnonymizeLabels: []string{"namespace", "pod"},
		RelabelConfigs:  parseRelabelConfigs(t, "- source_labels: [condition]\n  regex: Upgradeable\n  action: drop\n"),
	})
	require.NoError(t, err)
	return Policy{Allow: base.Allow, Rules: rules, Caps: []gathering.Cap{{Selector: "cluster_operator_conditions", Allow: capList, Max: 20}}}
}

// With the cache, every cycle queues exactly what it queues without one,
// with the same counts, in both exposition formats.
func TestSeriesCacheSameOutputAsUncached(t *testing.T) {
	fixture := readFixture(t, "federate-sample.prom")
	for _, proto := range []bool{false, true} {
		t.Run(fmt.Sprintf("protobuf=%v", proto), func(t *testing.T) {
			prom := fakePrometheus(t, fixture, proto)
			pol := cachePolicy(t, fixtureSalt)
			cached, cq := newCacheTestForwarder(t, prom.URL, pol, Options{MaxSamplesPerRequest: 40})
			plain, pq := newCacheTestForwarder(t, prom.URL, pol, Options{MaxSamplesPerRequest: 40, SeriesCacheSize: -1})
			for cycle := range 3 {
				require.NoError(t, cached.Collect(context.Background()))
				require.NoError(t, plain.Collect(context.Background()))
				got, raw := queuedSeries(t, cq)
				want, _ := queuedSeries(t, pq)
				require.NotEmpty(t, want)
				require.Equal(t, want, got, "cycle %d", cycle)
				for _, b := range raw {
					require.NotContains(t, string(b), fixtureID, "raw id must never be queued")
				}
				for _, s := range got {
					require.NotContains(t, s, `namespace="openshift-`, "anonymized namespace must never be queued")
				}
			}
			require.Equal(t, 300, len(cached.scratch.cache.entries), "every federated series is remembered")
			require.Empty(t, plain.scratch.cache.entries)
			for _, c := range []string{ReasonAllowlist, ReasonRelabel} {
				require.Equal(t, testutil.ToFloat64(plain.m.filtered.WithLabelValues(c)), testutil.ToFloat64(cached.m.filtered.WithLabelValues(c)), c)
			}
			require.Positive(t, testutil.ToFloat64(cached.m.filtered.WithLabelValues(ReasonRelabel)))
			require.Positive(t, testutil.ToFloat64(cached.m.dropped.WithLabelValues(ReasonSelectorCap)))
			require.Equal(t, testutil.ToFloat64(plain.m.dropped.WithLabelValues(ReasonSelectorCap)), testutil.ToFloat64(cached.m.dropped.WithLabelValues(ReasonSelectorCap)))
			require.Equal(t, testutil.ToFloat64(plain.m.queued), testutil.ToFloat64(cached.m.queued))
		})
	}
}

// A new policy drops everything the cache learnt under the old one.
func TestSeriesCacheInvalidatedOnPolicyChange(t *testing.T) {
	fixture := readFixture(t, "federate-sample.prom")
	prom := fakePrometheus(t, fixture, false)
	f, q := newCacheTestForwarder(t, prom.URL, cachePolicy(t, fixtureSalt), Options{})
	require.NoError(t, f.Collect(context.Background()))
	before, _ := queuedSeries(t, q)

	next := cachePolicy(t, "another-salt-of-16+-bytes")
	narrow, err := allowlist.Parse([]string{`cluster_version`})
	require.NoError(t, err)
	next.Allow = narrow
	require.NoError(t, f.SetPolicy(next))
	require.NoError(t, f.Collect(context.Background()))
	got, raw := queuedSeries(t, q)

	ref, rq := newCacheTestForwarder(t, prom.URL, next, Options{SeriesCacheSize: -1})
	require.NoError(t, ref.Collect(context.Background()))
	want, _ := queuedSeries(t, rq)
	require.NotEmpty(t, want)
	require.Less(t, len(want), len(before))
	require.Equal(t, want, got)
	oldID := relabel.Anonymize([]byte(fixtureSalt), fixtureID)
	for _, b := range raw {
		require.NotContains(t, string(b), oldID, "nothing computed under the old salt")
	}
	require.Same(t, f.policy.Load(), f.scratch.cache.pol)
}

// The cache never holds more than SeriesCacheSize series; the rest are
// processed without it, with the same result.
func TestSeriesCacheBounded(t *testing.T) {
	fixture := readFixture(t, "federate-sample.prom")
	prom := fakePrometheus(t, fixture, false)
	pol := cachePolicy(t, fixtureSalt)
	f, q := newCacheTestForwarder(t, prom.URL, pol, Options{SeriesCacheSize: 10})
	ref, rq := newCacheTestForwarder(t, prom.URL, pol, Options{SeriesCacheSize: -1})
	for range 2 {
		require.NoError(t, f.Collect(context.Background()))
		require.NoError(t, ref.Collect(context.Background()))
		require.Len(t, f.scratch.cache.entries, 10)
		got, _ := queuedSeries(t, q)
		want, _ := queuedSeries(t, rq)
		require.Equal(t, want, got)
	}
	require.LessOrEqual(t, f.scratch.cache.syms.len(), symbolsPerSeries*10+4096, "symbols are bounded too")
}

// Series missing from a complete cycle are forgotten; a failed cycle
// forgets nothing.
func TestSeriesCacheEvictsUnseenSeries(t *testing.T) {
	var body atomic.Pointer[[]byte]
	all := []byte("up{job=\"a\"} 1 1767268800000\nup{job=\"b\"} 1 1767268800000\nup{job=\"c\"} 1 1767268800000\n")
	some := []byte("up{job=\"b\"} 2 1767268860000\n")
	body.Store(&all)
	prom := switchablePrometheus(t, &body)
	al, err := allowlist.Parse([]string{`up`})
	require.NoError(t, err)
	pol := fixturePolicy(t)
	pol.Allow = al
	f, q := newCacheTestForwarder(t, prom.URL, pol, Options{})
	require.NoError(t, f.Collect(context.Background()))
	require.Len(t, f.scratch.cache.entries, 3)

	body.Store(nil)
	require.Error(t, f.Collect(context.Background()))
	require.Len(t, f.scratch.cache.entries, 3, "a failed cycle evicts nothing")

	body.Store(&some)
	require.NoError(t, f.Collect(context.Background()))
	require.Len(t, f.scratch.cache.entries, 1)
	require.Equal(t, 1.0, testutil.ToFloat64(f.m.cachedSeries))
	got, _ := queuedSeries(t, q)
	require.Len(t, got, 4)
	require.Contains(t, got, fmt.Sprintf("__name__=%q,_id=%q,job=%q, 2@1767268860000", "up", hashedID, "b"))
}

// The text parser's labels depend on the family type (le and quantile
// values are normalized in histograms and summaries), so equal series text
// under another type is another series.
func TestSeriesCacheKeyIncludesType(t *testing.T) {
	var body atomic.Pointer[[]byte]
	typed := []byte("# TYPE h histogram\nh_bucket{le=\"1\"} 1 1767268800000\n")
	untyped := []byte("h_bucket{le=\"1\"} 1 1767268800000\n")
	prom := switchablePrometheus(t, &body)
	al, err := allowlist.Parse([]string{`{__name__=~"h_.*"}`})
	require.NoError(t, err)
	pol := fixturePolicy(t)
	pol.Allow = al
	f, q := newCacheTestForwarder(t, prom.URL, pol, Options{})
	for _, tc := range []struct {
		body []byte
		le   string
	}{{typed, "1.0"}, {untyped, "1"}, {typed, "1.0"}} {
		body.Store(&tc.body)
		require.NoError(t, f.Collect(context.Background()))
		got, _ := queuedSeries(t, q)
		require.Len(t, got, 1+strings.Count(string(tc.body), "# TYPE"))
		require.Contains(t, got[0], fmt.Sprintf("le=%q", tc.le))
	}
}

func TestSymbolsPerRequestRefs(t *testing.T) {
	s := newSymbols()
	a, b, empty := s.intern("a"), s.intern("b"), s.intern("")
	require.Equal(t, uint32(0), empty)
	require.Equal(t, a, s.intern("a"))
	require.Equal(t, []uint32{1, 1, 0, 2}, []uint32{s.ref(b), s.ref(b), s.ref(empty), s.ref(a)})
	require.Equal(t, []string{"", "b", "a"}, s.reqSyms)
	s.startRequest()
	require.Equal(t, []string{""}, s.reqSyms)
	require.Equal(t, uint32(1), s.ref(a))
	require.Equal(t, []string{"", "a"}, s.reqSyms)

	s.gen = ^uint32(0) // the next request wraps the generation
	s.startRequest()
	require.Equal(t, uint32(1), s.gen)
	require.Equal(t, uint32(1), s.ref(b), "no stale reference survives the wrap")
	require.Equal(t, []string{"", "b"}, s.reqSyms)
}

func parseRelabelConfigs(t *testing.T, doc string) []*promrelabel.Config {
	t.Helper()
	var cs []*promrelabel.Config
	require.NoError(t, yaml.Unmarshal([]byte(doc), &cs))
	return cs
}

// Series that come, go and change order between cycles are processed as
// without a cache.
func TestSeriesCacheChurnMatchesUncached(t *testing.T) {
	var lines []string
	for _, l := range strings.Split(string(readFixture(t, "federate-sample.prom")), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	reversed := slices.Clone(lines[100:])
	slices.Reverse(reversed)
	shifted := make([]string, 0, len(lines))
	for _, l := range lines[:150] {
		shifted = append(shifted, strings.Replace(l, "{", `{churn="1",`, 1))
	}
	var body atomic.Pointer[[]byte]
	prom := switchablePrometheus(t, &body)
	pol := cachePolicy(t, fixtureSalt)
	cached, cq := newCacheTestForwarder(t, prom.URL, pol, Options{SeriesCacheSize: 250})
	plain, pq := newCacheTestForwarder(t, prom.URL, pol, Options{SeriesCacheSize: -1})
	for i, set := range [][]string{lines, reversed, append(shifted, lines[200:]...), lines} {
		b := []byte(strings.Join(set, "\n") + "\n")
		body.Store(&b)
		require.NoError(t, cached.Collect(context.Background()))
		require.NoError(t, plain.Collect(context.Background()))
		got, _ := queuedSeries(t, cq)
		want, _ := queuedSeries(t, pq)
		require.NotEmpty(t, want)
		require.Equal(t, want, got, "cycle %d", i)
		require.LessOrEqual(t, len(cached.scratch.cache.entries), 250)
	}
}

// Classic histograms and summaries: every bucket, quantile, _sum and _count
// is its own series, in both formats.
func TestSeriesCacheHistogramsAndSummaries(t *testing.T) {
	body := []byte(`# HELP h_seconds A histogram.
# TYPE h_seconds histogram
h_seconds_bucket{job="a",le="0.5"} 1 1767268800000
h_seconds_bucket{job="a",le="1"} 2 1767268800000
h_seconds_bucket{job="a",le="+Inf"} 3 1767268800000
h_seconds_sum{job="a"} 2.5 1767268800000
h_seconds_count{job="a"} 3 1767268800000
h_seconds_bucket{job="b",le="0.5"} 4 1767268800000
h_seconds_bucket{job="b",le="1"} 5 1767268800000
h_seconds_bucket{job="b",le="+Inf"} 6 1767268800000
h_seconds_sum{job="b"} 7.5 1767268800000
h_seconds_count{job="b"} 6 1767268800000
# HELP s_seconds A summary.
# TYPE s_seconds summary
s_seconds{job="a",quantile="0.5"} 0.1 1767268800000
s_seconds{job="a",quantile="0.99"} 0.9 1767268800000
s_seconds_sum{job="a"} 10 1767268800000
s_seconds_count{job="a"} 20 1767268800000
`)
	al, err := allowlist.Parse([]string{`{__name__=~"h_.*|s_.*"}`})
	require.NoError(t, err)
	pol := cachePolicy(t, fixtureSalt)
	pol.Allow, pol.Caps = al, nil
	for _, proto := range []bool{false, true} {
		t.Run(fmt.Sprintf("protobuf=%v", proto), func(t *testing.T) {
			prom := fakePrometheus(t, body, proto)
			cached, cq := newCacheTestForwarder(t, prom.URL, pol, Options{})
			plain, pq := newCacheTestForwarder(t, prom.URL, pol, Options{SeriesCacheSize: -1})
			for range 2 {
				require.NoError(t, cached.Collect(context.Background()))
				require.NoError(t, plain.Collect(context.Background()))
				got, _ := queuedSeries(t, cq)
				want, _ := queuedSeries(t, pq)
				require.Equal(t, want, got)
				require.Len(t, got, 14+2, "14 series and the metadata of 2 families")
			}
			require.Len(t, cached.scratch.cache.entries, 14)
		})
	}
}
