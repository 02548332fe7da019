package receive

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

// rawSeries is a series as a sender builds it: label pairs in its order,
// empty values and duplicate names included, and exemplars' label pairs.
type rawSeries struct {
	labels    []string
	exemplars [][]string
	noSamples bool
}

// versions sends the same raw series in either remote-write version.
var versions = []struct {
	name    string
	request func(t testing.TB, id *auth.Identity, ts int64, series ...rawSeries) *http.Request
}{
	{"1.0", rawRequestV1},
	{"2.0", rawRequestV2},
}

func rawRequestV1(t testing.TB, id *auth.Identity, ts int64, series ...rawSeries) *http.Request {
	pairs := func(kv []string) []prompb.Label {
		var ls []prompb.Label
		for i := 0; i+1 < len(kv); i += 2 {
			ls = append(ls, prompb.Label{Name: kv[i], Value: kv[i+1]})
		}
		return ls
	}
	var tss []prompb.TimeSeries
	for _, s := range series {
		p := prompb.TimeSeries{Labels: pairs(s.labels)}
		if !s.noSamples {
			p.Samples = []prompb.Sample{{Value: 1, Timestamp: ts}}
		}
		for _, e := range s.exemplars {
			p.Exemplars = append(p.Exemplars, prompb.Exemplar{Labels: pairs(e), Value: 1, Timestamp: ts})
		}
		tss = append(tss, p)
	}
	return newRequest(encode(t, tss...), id)
}

func rawRequestV2(t testing.TB, id *auth.Identity, ts int64, series ...rawSeries) *http.Request {
	b := newV2()
	refs := func(kv []string) []uint32 {
		var out []uint32
		for _, s := range kv {
			out = append(out, b.st.Symbolize(s))
		}
		return out
	}
	for _, s := range series {
		p := writev2.TimeSeries{LabelsRefs: refs(s.labels)}
		if !s.noSamples {
			p.Samples = []writev2.Sample{{Value: 1, Timestamp: ts}}
		}
		for _, e := range s.exemplars {
			p.Exemplars = append(p.Exemplars, writev2.Exemplar{LabelsRefs: refs(e), Value: 1, Timestamp: ts})
		}
		b.req.Timeseries = append(b.req.Timeseries, p)
	}
	return newRequestV2(b.encode(t), id)
}

// A label with an empty value is absent, in 2.0 as in 1.0: it counts for no
// label limit, and the series is the same series (one for the series
// limits, the same labels stored) whichever version sent it, with or
// without it.
func TestEmptyValuedLabelsAreAbsentInBothVersions(t *testing.T) {
	labelLimits := func(s *limits.Spec) {
		s.MaxLabelNamesPerSeries = ptr(3) // __name__, job and the _id added
		s.MaxLabelNameLength = ptr(8)
	}
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	// Two empty labels more than the limit admits, one with a name over
	// its length, and an empty _id.
	withEmpty := []string{"zone", "", "__name__", "up", "_id", "", "job", "a", "long_name_x", ""}

	t.Run("limits", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			labels []string
			want   int
		}{
			{"empty labels past every limit", withEmpty, http.StatusNoContent},
			{"one label too many, empty labels aside", append([]string{"x", "1"}, withEmpty...), http.StatusBadRequest},
			{"a name too long, empty labels aside", append([]string{"long_name_y", "1"}, withEmpty[:6]...), http.StatusBadRequest},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var bodies []string
				var stored [][]prompb.TimeSeries
				for _, v := range versions {
					w := &fakeWriter{}
					h := NewHandler(discard(), nil, w, newLimiter(labelLimits), Options{})
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, v.request(t, id, 1000, rawSeries{labels: tc.labels}))
					require.Equal(t, tc.want, rec.Code, "%s: %s", v.name, rec.Body)
					bodies, stored = append(bodies, rec.Body.String()), append(stored, w.series)
				}
				require.Equal(t, bodies[0], bodies[1], "the same answer")
				require.Equal(t, stored[0], stored[1], "the same series stored")
			})
		}
	})

	t.Run("one series", func(t *testing.T) {
		db := openStorage(t, 0)
		lim := newLimiter(labelLimits)
		lim.TrackClusters(Reasons())
		h := NewHandler(discard(), nil, db, lim, Options{})
		now := time.Now().UnixMilli()
		for i, r := range []*http.Request{
			rawRequestV1(t, id, now, rawSeries{labels: withEmpty}),
			rawRequestV2(t, id, now+1, rawSeries{labels: withEmpty}),
			rawRequestV2(t, id, now+2, rawSeries{labels: []string{"__name__", "up", "job", "a"}}),
		} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			require.Equal(t, http.StatusNoContent, rec.Code, "request %d: %s", i, rec.Body)
		}
		require.Equal(t, []string{`{__name__="up", _id="c1", job="a"}`}, storedSeries(t, db, "acme"))
		c, ok := lim.Cluster("acme", "c1")
		require.True(t, ok)
		require.Equal(t, int64(1), c.Series, "one series for the limits")
	})
}

// An erased cluster's series are refused before the limiter even when an
// empty _id comes first: the empty one is absent, the series is the erased
// cluster's.
func TestDenialLooksPastAnEmptyID(t *testing.T) {
	for _, v := range versions {
		t.Run(v.name, func(t *testing.T) {
			lim := newLimiter(nil)
			lim.TrackClusters(Reasons())
			w := &fakeWriter{}
			h := NewHandler(discard(), nil, w, lim, Options{Denied: func(_, cluster string) bool { return cluster == "erased" }})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, v.request(t, &auth.Identity{Tenant: "acme"}, 1000, rawSeries{labels: []string{"__name__", "up", "_id", "", "_id", "erased"}}))
			require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
			require.Contains(t, rec.Body.String(), "cluster was erased")
			require.Empty(t, w.series)
			_, shown := lim.Cluster("acme", "erased")
			require.False(t, shown, "not on the status page")
		})
	}
}

// A refused series' example on the status page hides another cluster's
// _id even behind an empty one.
func TestRefusalExampleLooksPastAnEmptyID(t *testing.T) {
	for _, v := range versions {
		t.Run(v.name, func(t *testing.T) {
			lim := newLimiter(nil)
			lim.TrackClusters(Reasons())
			h := NewHandler(discard(), nil, &fakeWriter{}, lim, Options{})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, v.request(t, &auth.Identity{Tenant: "acme", ClusterID: "c1"}, 1000,
				rawSeries{labels: []string{"__name__", "up", "_id", "", "_id", "c2"}, noSamples: true}))
			require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
			refusals := lim.RecentRefusals("acme", "c1")
			require.Len(t, refusals, 1)
			require.NotContains(t, refusals[0].Example, "c2")
			require.Contains(t, refusals[0].Example, redactedID)
		})
	}
}

func TestReplicaOfLooksPastAnEmptyValue(t *testing.T) {
	require.Equal(t, "prometheus-k8s-1", replicaOf([]prompb.TimeSeries{
		series("up", DefaultReplicaLabel, ""),
		series("up", DefaultReplicaLabel, "prometheus-k8s-1"),
	}, DefaultReplicaLabel))
}
