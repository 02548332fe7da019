//go:build !slicelabels

package receive

import (
	"fmt"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"
)

// Once its storage has grown, decoding and converting a request of samples
// with metadata allocates nothing (with slicelabels, symbols are copies),
// labels of empty value (left out) included.
func TestDecodeV2AllocatesNothingOnceGrown(t *testing.T) {
	b := newV2()
	for i := range 200 {
		b.series(labels.FromStrings("__name__", fmt.Sprintf("m%d", i%20), "_id", "c", "i", fmt.Sprint(i), "zone", ""), func(ts *writev2.TimeSeries) {
			ts.Samples = []writev2.Sample{{Value: float64(i), Timestamp: 1000}}
			ts.Metadata = b.meta(model.MetricTypeGauge, fmt.Sprintf("Help of m%d.", i%20), "bytes")
		})
	}
	b.req.Symbols = b.st.Symbols()
	raw, err := b.req.Marshal()
	require.NoError(t, err)
	lim := newLimiter(nil).For("t")
	var d v2Request
	allocs := testing.AllocsPerRun(20, func() {
		if err := decodeV2(raw, &d); err != nil {
			t.Fatal(err)
		}
		if _, err := convertV2(&d, &lim); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}
