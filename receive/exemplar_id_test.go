package receive

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// An exemplar is data of its series, whose _id is the credential's
// cluster: an _id among its labels is held to the series' rule, in both
// versions, so that no cluster stores another's _id (or its own raw id)
// in exemplars.
func TestExemplarIDIsBoundLikeTheSeries(t *testing.T) {
	c1 := auth.Identity{Tenant: "acme", ClusterID: "c1"}
	aliased := auth.Identity{Tenant: "acme", ClusterID: "pseudonym", ClusterIDAlias: "raw-uuid"}
	for _, tc := range []struct {
		name      string
		id        auth.Identity
		overwrite bool
		exemplar  []string
		want      int
		stored    []prompb.Label // the exemplar's labels as stored
	}{
		{"no _id", c1, false, []string{"trace_id", "x"}, http.StatusNoContent, []prompb.Label{{Name: "trace_id", Value: "x"}}},
		{"the cluster's _id", c1, false, []string{"_id", "c1", "trace_id", "x"}, http.StatusNoContent, []prompb.Label{{Name: "_id", Value: "c1"}, {Name: "trace_id", Value: "x"}}},
		{"an empty _id, kept as sent", c1, false, []string{"_id", "", "trace_id", "x"}, http.StatusNoContent, []prompb.Label{{Name: "_id"}, {Name: "trace_id", Value: "x"}}},
		{"another cluster's _id", c1, false, []string{"_id", "c2", "trace_id", "x"}, http.StatusBadRequest, nil},
		{"another cluster's _id, overwritten", c1, true, []string{"_id", "c2", "trace_id", "x"}, http.StatusNoContent, []prompb.Label{{Name: "_id", Value: "c1"}, {Name: "trace_id", Value: "x"}}},
		{"the raw id, rewritten", aliased, false, []string{"_id", "raw-uuid", "trace_id", "x"}, http.StatusNoContent, []prompb.Label{{Name: "_id", Value: "pseudonym"}, {Name: "trace_id", Value: "x"}}},
		{"a credential bound to no cluster", auth.Identity{Tenant: "acme"}, false, []string{"_id", "c2", "trace_id", "x"}, http.StatusNoContent, []prompb.Label{{Name: "_id", Value: "c2"}, {Name: "trace_id", Value: "x"}}},
	} {
		for _, v := range versions {
			t.Run(tc.name+"/"+v.name, func(t *testing.T) {
				w := &fakeWriter{}
				h := NewHandler(discard(), nil, w, newLimiter(nil), Options{OverwriteClusterID: tc.overwrite})
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, v.request(t, &tc.id, 1000, rawSeries{labels: []string{"__name__", "up"}, exemplars: [][]string{tc.exemplar}}))
				require.Equal(t, tc.want, rec.Code, rec.Body.String())
				if tc.want != http.StatusNoContent {
					require.Contains(t, rec.Body.String(), "series 0: exemplar _id does not match the authenticated cluster")
					require.InDelta(t, 1, testutil.ToFloat64(h.metrics.rejected.WithLabelValues(reasonClusterMismatch)), 0)
					require.Empty(t, w.series)
					return
				}
				require.Len(t, w.series, 1)
				require.Len(t, w.series[0].Exemplars, 1)
				require.Equal(t, tc.stored, w.series[0].Exemplars[0].Labels)
			})
		}
	}
}
