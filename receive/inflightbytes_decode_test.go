package receive

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/storage"
)

// firstBlocks holds the first write until released.
type firstBlocks struct {
	fakeWriter
	n                int
	entered, release chan struct{}
}

func (b *firstBlocks) Write(ctx context.Context, tenant string, series []prompb.TimeSeries) (storage.Stats, error) {
	b.n++
	if b.n == 1 {
		b.entered <- struct{}{}
		<-b.release
	}
	return b.fakeWriter.Write(ctx, tenant, series)
}

// TestHandlerMaxInflightBytesWhileDecoding: a write refused by
// --receive.max-inflight-bytes while its structures are decoded is 503
// (retry), never 400 or 413 (which clients drop), for every format; the
// budget is swept so that the refusal falls at every point of decoding.
func TestHandlerMaxInflightBytesWhileDecoding(t *testing.T) {
	v1 := encode(t, manySeries("c2", 0, 3000)...)
	b2 := newV2()
	for i := range 3000 {
		b2.series(labels.FromStrings("__name__", "csv_succeeded", "_id", "c2", "name", fmt.Sprintf("op-%04d", i)), func(ts *writev2.TimeSeries) {
			ts.Samples = []writev2.Sample{{Value: 1, Timestamp: 1000}}
		})
	}
	v2 := b2.encode(t)
	var fams []*dto.MetricFamily
	for i := range 3000 {
		fams = append(fams, gauge(fmt.Sprintf("g%04d", i), 1, 1000, "a", "b", "c", "d"))
	}
	up := framed(t, delimited(t, fams...))
	for _, tc := range []struct {
		name  string
		req   func() *http.Request
		serve func(h *Handler) func(http.ResponseWriter, *http.Request)
	}{
		{"v1", func() *http.Request { return newRequest(v1, &auth.Identity{Tenant: "a", ClusterID: "c2"}) }, func(h *Handler) func(http.ResponseWriter, *http.Request) { return h.ServeHTTP }},
		{"v2", func() *http.Request { return newRequestV2(v2, &auth.Identity{Tenant: "a", ClusterID: "c2"}) }, func(h *Handler) func(http.ResponseWriter, *http.Request) { return h.ServeHTTP }},
		{"upload", func() *http.Request { return uploadRequest(up, &auth.Identity{Tenant: "a", ClusterID: "c2"}) }, func(h *Handler) func(http.ResponseWriter, *http.Request) { return h.ServeUpload }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			codes := map[int]int{}
			for extra := int64(64 << 10); extra < 4<<20; extra += 128 << 10 {
				w := &firstBlocks{entered: make(chan struct{}, 1), release: make(chan struct{})}
				h := NewHandler(discard(), nil, w, newLimiter(nil), Options{MaxInflightBytes: reserveStep + extra})
				h.bytes.wait = time.Millisecond
				done := make(chan int, 1)
				go func() {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, newRequest(encode(t, series("up", "_id", "c1")), &auth.Identity{Tenant: "a", ClusterID: "c1"}))
					done <- rec.Code
				}()
				within(t, w.entered)
				rec := httptest.NewRecorder()
				tc.serve(h)(rec, tc.req())
				codes[rec.Code]++
				close(w.release)
				within(t, done)
				require.Zero(t, h.bytes.used.Load())
			}
			t.Logf("codes: %v", codes)
			require.Zero(t, codes[400], "refusals reported as 400")
			require.Zero(t, codes[413], "refusals reported as 413")
			require.NotZero(t, codes[http.StatusServiceUnavailable], "the sweep refused nothing")
			require.NotZero(t, codes[http.StatusNoContent]+codes[http.StatusOK], "the sweep admitted nothing")
		})
	}
}
