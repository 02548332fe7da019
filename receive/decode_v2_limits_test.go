package receive

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/alecthomas/units"
	"github.com/golang/snappy"
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
