package receive

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

// Labels out of order, as a client that builds them from a map sends them,
// are sorted and counted (once valid), in 1.0 and 2.0 alike, as Prometheus accepts them;
// what a sort cannot repair (a duplicate or empty name) is still refused.
func TestHandlerSortsUnsortedLabels(t *testing.T) {
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	want := []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: "c1"}, {Name: "a", Value: "2"}, {Name: "job", Value: "x"}, {Name: "z", Value: "1"}}
	v2 := func(names ...string) []byte {
		b := newV2()
		var refs []uint32
		for _, s := range names {
			refs = append(refs, b.st.Symbolize(s))
		}
		b.req.Timeseries = []writev2.TimeSeries{{LabelsRefs: refs, Samples: []writev2.Sample{{Value: 1, Timestamp: 1000}}}}
		return b.encode(t)
	}
	for _, tc := range []struct {
		name     string
		req      *http.Request
		code     int
		unsorted float64
		want     []prompb.Label
	}{
		{"1.0 sorted", newRequest(encode(t, series("up", "a", "2", "job", "x", "z", "1")), id), 204, 0, want},
		{"1.0 unsorted", newRequest(encode(t, series("up", "z", "1", "job", "x", "a", "2")), id), 204, 1, want},
		{"1.0 name last", newRequest(encode(t, prompb.TimeSeries{
			Labels:  []prompb.Label{{Name: "z", Value: "1"}, {Name: "job", Value: "x"}, {Name: "a", Value: "2"}, {Name: "__name__", Value: "up"}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: 1000}},
		}), id), 204, 1, want},
		{"1.0 unsorted with a foreign _id", newRequest(encode(t, series("up", "z", "1", "_id", "other", "a", "2")), id), 400, 0, nil},
		{"1.0 unsorted duplicate", newRequest(encode(t, series("up", "z", "1", "a", "2", "z", "3")), id), 400, 0, nil},
		{"2.0 sorted", newRequestV2(v2("__name__", "up", "a", "2", "job", "x", "z", "1"), id), 204, 0, want},
		{"2.0 unsorted", newRequestV2(v2("z", "1", "job", "x", "__name__", "up", "a", "2"), id), 204, 1, want},
		{"2.0 unsorted duplicate", newRequestV2(v2("z", "1", "__name__", "up", "z", "2"), id), 400, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &fakeWriter{}
			h := NewHandler(discard(), nil, w, newLimiter(nil), Options{})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, tc.req)
			require.Equal(t, tc.code, rec.Code, rec.Body.String())
			require.InDelta(t, tc.unsorted, testutil.ToFloat64(h.metrics.unsortedSeries), 0)
			if tc.want == nil {
				require.Empty(t, w.series)
				return
			}
			require.Len(t, w.series, 1)
			require.Equal(t, tc.want, w.series[0].Labels)
		})
	}
}

func TestValidateSeriesSortsOnlyWhenNeeded(t *testing.T) {
	lim := limits.DefaultTenantLimits()
	for _, tc := range []struct {
		name     string
		in       []string
		resorted bool
		err      string
	}{
		{"sorted", []string{"__name__", "up", "a", "1", "b", "2"}, false, ""},
		{"empty values dropped, rest sorted", []string{"__name__", "up", "c", "", "b", "2"}, false, ""},
		{"two swapped", []string{"__name__", "up", "b", "2", "a", "1"}, true, ""},
		{"reversed", []string{"b", "2", "a", "1", "__name__", "up"}, true, ""},
		{"duplicate after sort", []string{"b", "2", "__name__", "up", "b", "1"}, true, "duplicate label name"},
		{"empty name", []string{"__name__", "up", "", "1"}, false, "empty label name"},
		{"no name after sort", []string{"b", "2", "a", "1"}, true, "no metric name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := prompb.TimeSeries{Samples: []prompb.Sample{{Value: 1}}}
			for i := 0; i < len(tc.in); i += 2 {
				ts.Labels = append(ts.Labels, prompb.Label{Name: tc.in[i], Value: tc.in[i+1]})
			}
			name, resorted, serr := validateSeries(&ts, &lim, auth.Identity{}, false)
			require.Equal(t, tc.resorted, resorted)
			if tc.err != "" {
				require.NotNil(t, serr)
				require.Contains(t, serr.msg, tc.err)
				return
			}
			require.Nil(t, serr)
			require.Equal(t, "up", name)
			for i := 1; i < len(ts.Labels); i++ {
				require.Less(t, ts.Labels[i-1].Name, ts.Labels[i].Name)
			}
		})
	}
}

// On the Telemeter paths the raw id a cluster sends is rewritten before
// anything can refuse the series: a refused series' labels are kept as the
// status page's example, and must never hold the raw id.
func TestValidateRewritesTheRawIDBeforeRefusing(t *testing.T) {
	lim := limits.DefaultTenantLimits()
	id := auth.Identity{Tenant: "acme", ClusterID: "pseudonym", ClusterIDAlias: "raw-uuid"}
	for name, ts := range map[string]prompb.TimeSeries{
		"no samples":        {Labels: []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: "raw-uuid"}}},
		"bad label before":  {Labels: []prompb.Label{{Name: "A-b", Value: "x"}, {Name: "_id", Value: "raw-uuid"}}, Samples: []prompb.Sample{{Value: 1}}},
		"accepted, rewrote": {Labels: []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: "raw-uuid"}}, Samples: []prompb.Sample{{Value: 1}}},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, _ = validateSeries(&ts, &lim, id, false)
			require.NotContains(t, formatLabels(ts.Labels), "raw-uuid")
			require.Contains(t, formatLabels(ts.Labels), `_id="pseudonym"`)
		})
	}
}

// A series refused for naming another _id than its credential's keeps its
// labels as the status page's example, but not that _id: it may be a raw
// cluster id (an upload that skipped the pseudonym) or another cluster's.
func TestRefusalExampleRedactsAnotherClustersID(t *testing.T) {
	lim := newLimiter(nil)
	lim.TrackClusters(Reasons())
	h := NewHandler(discard(), nil, discardWriter{}, lim, Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, series("up", "_id", "0f2c6b3e-raw-uuid")), id))
	require.Equal(t, http.StatusBadRequest, rec.Code)
	recent := lim.RecentRefusals("acme", "c1")
	require.Len(t, recent, 1)
	require.Equal(t, reasonClusterMismatch, recent[0].Reason)
	require.Equal(t, `{__name__="up", _id="`+redactedID+`"}`, recent[0].Example)
}
