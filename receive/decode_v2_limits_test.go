package receive

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/alecthomas/units"
	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

// A 2.0 label is a pair of references, so a small body can name a large
// symbol many times. Limits must apply before labels are built.
func TestV2LabelExpansionIsBounded(t *testing.T) {
	big := strings.Repeat("a", 1<<20) // one 1 MiB symbol
	refs := make([]uint32, 0, 2*600)
	for range 600 {
		refs = append(refs, 1, 1)
	}
	encode := func(req *writev2.Request) []byte {
		raw, err := req.Marshal()
		require.NoError(t, err)
		return snappy.Encode(nil, raw)
	}
	id := &auth.Identity{Tenant: "t", ClusterID: "c"}

	t.Run("many references to a big symbol", func(t *testing.T) {
		body := encode(&writev2.Request{Symbols: []string{"", big}, Timeseries: []writev2.TimeSeries{
			{LabelsRefs: refs, Samples: []writev2.Sample{{Value: 1, Timestamp: 1}}},
		}})
		h := NewHandler(discard(), nil, discardWriter{}, newLimiter(nil), Options{})
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequestV2(body, id))
		runtime.ReadMemStats(&after)
		require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
		require.Contains(t, rec.Body.String(), "the limit is 64")
		require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "no label was built")
	})

	t.Run("within per-series limits but over the request budget", func(t *testing.T) {
		value := strings.Repeat("v", 4000)
		req := &writev2.Request{Symbols: []string{"", "__name__", "up", "a", value}}
		for range 200 { // 200 series × 4 KB of labels = 800 KB > 4 × 64 KiB
			req.Timeseries = append(req.Timeseries, writev2.TimeSeries{
				LabelsRefs: []uint32{1, 2, 3, 4}, Samples: []writev2.Sample{{Value: 1, Timestamp: 1}},
			})
		}
		lim := newLimiter(func(s *limits.Spec) {
			s.MaxBodyBytes, s.MaxDecodedBytes = ptr(units.Base2Bytes(64<<10)), ptr(units.Base2Bytes(64<<10))
		})
		h := NewHandler(discard(), nil, discardWriter{}, lim, Options{})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequestV2(encode(req), id))
		require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
		require.Contains(t, rec.Body.String(), "labels of the request expand beyond")
	})
}

// Labels of empty value are absent: they count for no limit and are not
// built, so a series of many takes room in the label arena only for the
// labels it keeps, and no series' labels move out of the arena (sized
// before they are built).
func TestV2EmptyLabelsTakeNoRoom(t *testing.T) {
	req := writev2.Request{Symbols: []string{"", "__name__", "up", "job", "a", "zone"}}
	refs := []uint32{1, 2, 3, 4}
	for range 100 {
		refs = append(refs, 5, 0) // zone="", past the limit of 64 labels
	}
	for range 3 {
		req.Timeseries = append(req.Timeseries, writev2.TimeSeries{LabelsRefs: refs, Samples: []writev2.Sample{{Value: 1, Timestamp: 1}}})
	}
	d, b := convertedV2(t, &req)
	require.Len(t, d.conv.labels, 3*3, "two labels and room for an _id, per series")
	for i := range b.series {
		require.Nil(t, b.invalid[i].serr)
		require.Equal(t, []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "job", Value: "a"}}, b.series[i].Labels)
		require.Same(t, &d.conv.labels[3*i], &b.series[i].Labels[0], "series %d is in the arena", i)
	}
}
