package receive

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// On the Telemeter paths (and for a static token bound to a raw id) the
// cluster sends its raw id, which the receiver stores nowhere: like the
// forwarder, it replaces the raw id inside any label value of the series
// and of its exemplars with the pseudonym, not only an _id equal to it.
func TestRawIDIsReplacedInEveryLabelValue(t *testing.T) {
	const raw = "0f2c6b3e-6d0e-4e7b-9a51-2d6f1c9b8a77"
	id := auth.Identity{Tenant: "acme", ClusterID: "pseudonym", ClusterIDAlias: raw}
	for _, v := range versions {
		t.Run(v.name, func(t *testing.T) {
			w := &fakeWriter{}
			h := NewHandler(discard(), nil, w, newLimiter(nil), Options{})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, v.request(t, &id, 1000, rawSeries{
				labels:    []string{"__name__", "console_url", "_id", raw, "url", "https://console.apps." + raw + ".example.com", "cluster", raw},
				exemplars: [][]string{{"trace_id", "x", "cluster", raw}},
			}))
			require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
			require.Len(t, w.series, 1)
			stored := formatLabels(w.series[0].Labels)
			require.NotContains(t, stored, raw)
			require.Equal(t, `{__name__="console_url", _id="pseudonym", cluster="pseudonym", url="https://console.apps.pseudonym.example.com"}`, stored)
			require.Len(t, w.series[0].Exemplars, 1)
			require.ElementsMatch(t, []prompb.Label{{Name: "trace_id", Value: "x"}, {Name: "cluster", Value: "pseudonym"}}, w.series[0].Exemplars[0].Labels)
		})
	}
}

// A raw id too short to tell from other text (a test cluster's "c1") is
// replaced only where it is the whole _id, as the forwarder scrubs only
// values of 4 bytes or more.
func TestShortRawIDIsReplacedInIDOnly(t *testing.T) {
	id := auth.Identity{Tenant: "acme", ClusterID: "pseudonym", ClusterIDAlias: "c1"}
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, rawRequestV1(t, &id, 1000, rawSeries{labels: []string{"__name__", "up", "_id", "c1", "pod", "etc1"}}))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.Len(t, w.series, 1)
	require.Equal(t, `{__name__="up", _id="pseudonym", pod="etc1"}`, formatLabels(w.series[0].Labels))
}
