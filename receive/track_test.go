package receive

import (
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/limits"
)

// The handler feeds the limiter's cluster tracking: admitted samples, the
// gathering-definition version, protocol and client, and refusals with an
// example label set, against the cluster that sent them.
func TestClusterTracking(t *testing.T) {
	lim := newLimiter(func(s *limits.Spec) { s.MaxSeriesPerCluster = ptr(3) })
	lim.TrackClusters(Reasons())
	h := NewHandler(discard(), nil, discardWriter{}, lim, Options{})
	bound := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	unbound := &auth.Identity{Tenant: "acme"}

	post := func(id *auth.Identity, body []byte) int {
		r := newRequest(body, id)
		r.Header.Set("User-Agent", "phonehome-forwarder/9.9")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	body := encode(t, append(manySeries("c1", 0, 4), series(gathering.InfoMetric, "_id", "c1", "version", "2026-01"))...)
	require.Equal(t, 400, post(bound, body)) // the 4th csv series is over the cluster limit
	require.Equal(t, 400, post(unbound, encode(t, series("up", "_id", "c2"), series("bad-name", "_id", "c2"))))

	c1, ok := lim.Cluster("acme", "c1")
	require.True(t, ok)
	require.EqualValues(t, 3, c1.Series)
	require.EqualValues(t, 3, c1.Samples) // the info series is over the limit too
	require.Equal(t, map[string]uint64{reasonSeriesLimit: 2}, c1.Refusals())
	proto, client, def := c1.Client()
	require.Equal(t, []string{protoV1, "phonehome-forwarder/9.9", ""}, []string{proto, client, def})

	// With room, the info series carries its version.
	lim.Reload(limits.Config{})
	require.Equal(t, 204, post(bound, body))
	c1, _ = lim.Cluster("acme", "c1")
	_, _, def = c1.Client()
	require.Equal(t, "2026-01", def)

	c2, ok := lim.Cluster("acme", "c2")
	require.True(t, ok)
	require.Equal(t, map[string]uint64{reasonInvalidLabels: 1}, c2.Refusals())
	recent := lim.RecentRefusals("acme", "c2")
	require.Len(t, recent, 1)
	require.Equal(t, `{__name__="bad-name", _id="c2"}`, recent[0].Example)
	require.Equal(t, `{__name__="csv_succeeded", _id="c1", name="op-003"}`, lim.RecentRefusals("acme", "c1")[0].Example)
}

// A credential bound to no cluster names clusters through the series' _id:
// refusals of ids the limiter does not know count for the tenant only, so
// refused series of made-up ids cannot grow the table of clusters.
func TestRefusalsOfUnknownClustersDoNotGrowTheTable(t *testing.T) {
	lim := newLimiter(nil)
	lim.TrackClusters(Reasons())
	h := NewHandler(discard(), nil, discardWriter{}, lim, Options{})
	var bad []prompb.TimeSeries
	for i := range 500 {
		ts := series("up", "_id", fmt.Sprintf("made-up-%d", i))
		ts.Samples = nil // refused: no samples
		bad = append(bad, ts)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest(encode(t, bad...), &auth.Identity{Tenant: "acme"}))
	require.Equal(t, 400, rec.Code)
	require.Empty(t, lim.Clusters("acme"), "no cluster tracked for refused series of unknown ids")
	ts, ok := lim.Tenant("acme")
	require.True(t, ok)
	require.Equal(t, uint64(500), ts.Refused[reasonNoSamples], "counted for the tenant")
}
