package receive

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

// BenchmarkHandlerV2 runs 2.0 requests through the handler (storage only
// counts) in the shape the forwarder sends: every series with its family's
// metadata, which bench/fleet's BenchmarkReceiveRemoteWrite leaves out.
func BenchmarkHandlerV2(b *testing.B) {
	for _, n := range []int{224, 2000} {
		for _, withMeta := range []bool{false, true} {
			b.Run(fmt.Sprintf("series=%d/metadata=%t", n, withMeta), func(b *testing.B) {
				req := newV2()
				for i := range n {
					fam := fmt.Sprintf("family_%d_total", i%50)
					req.series(labels.FromStrings("__name__", fam, "_id", "c", "namespace", fmt.Sprintf("ns-%d", i%7), "pod", fmt.Sprintf("pod-%d", i)), func(ts *writev2.TimeSeries) {
						ts.Samples = []writev2.Sample{{Value: float64(i), Timestamp: 1_700_000_000_000}}
						if withMeta {
							ts.Metadata = req.meta(model.MetricTypeCounter, "Help text of "+fam+", as an exporter writes it.", "")
						}
					})
				}
				body := req.encode(b)
				inf, big := math.Inf(1), math.MaxInt32
				h := NewHandler(discard(), nil, discardWriter{}, newLimiter(func(s *limits.Spec) {
					s.SamplesPerSecondPerCluster, s.SamplesPerSecondPerTenant = &inf, &inf
					s.BurstPerCluster, s.BurstPerTenant = &big, &big
				}), Options{Denied: func(string, string) bool { return false }, MaxInflightBytes: 1 << 30}) // as the receiver wires it (storage.DB.Denied, the flag's default)
				id := &auth.Identity{Tenant: "t", ClusterID: "c"}
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, newRequestV2(body, id))
					if rec.Code != http.StatusNoContent {
						b.Fatalf("%d: %s", rec.Code, rec.Body)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/sample")
			})
		}
	}
}
