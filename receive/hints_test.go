package receive

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/storagetest"
)

// The head reference of a series is kept in the limiter's entry of the
// series (hintedWriter): after a first write the limiter returns it for the
// same labels, later writes use it, and every sample lands on its series.
func TestHandlerKeepsHeadReferenceInLimiter(t *testing.T) {
	db, err := storage.Open(discard(), nil, t.TempDir(), storage.Config{FlushOnShutdown: ptr(false), UploadOnShutdown: ptr(false)})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	lim := newLimiter(nil)
	h := NewHandler(discard(), nil, db, lim, Options{})
	require.NotNil(t, h.hintW, "*storage.DB takes hints")
	id := &auth.Identity{Tenant: "t", ClusterID: "c1"}
	series := func(ts int64) []prompb.TimeSeries {
		return []prompb.TimeSeries{
			{Labels: []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "etcd"}}, Samples: []prompb.Sample{{Value: 1, Timestamp: ts}}},
			{Labels: []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "olm"}}, Samples: []prompb.Sample{{Value: 2, Timestamp: ts}}},
		}
	}
	send := func(ts int64) {
		t.Helper()
		raw, err := (&prompb.WriteRequest{Timeseries: series(ts)}).Marshal()
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(snappy.Encode(nil, raw), id))
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	}
	// The key of a series as admit computes it: labels as stored (_id added, sorted).
	key := func(name string) limits.Key {
		return seriesKey([]prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "_id", Value: "c1"}, {Name: "name", Value: name}})
	}
	hint := func(name string) uint64 {
		s := lim.Session("t", "c1")
		h, err := s.AdmitKey("csv_succeeded", key(name))
		require.NoError(t, err)
		return h
	}
	send(1000)
	etcd, olm := hint("etcd"), hint("olm")
	require.NotZero(t, etcd)
	require.NotZero(t, olm)
	require.NotEqual(t, etcd, olm)
	send(2000)
	send(3000)
	require.Equal(t, etcd, hint("etcd"))
	require.Equal(t, olm, hint("olm"))
	require.Equal(t, []string{
		`{__name__="csv_succeeded", _id="c1", name="etcd"}`,
		`{__name__="csv_succeeded", _id="c1", name="olm"}`,
	}, storedSeries(t, db, "t"))
	require.Equal(t, map[string][]float64{"etcd": {1, 1, 1}, "olm": {2, 2, 2}}, storagetest.ValuesByLabel(t, db.Querier, "t", "name"))
}
