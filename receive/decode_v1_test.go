package receive

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
)

// v1Seeds are requests with every field the decoder handles itself or hands
// to the generated code.
func v1Seeds(t testing.TB) [][]byte {
	full := prompb.WriteRequest{
		Timeseries: []prompb.TimeSeries{
			{
				Labels:  []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "etcd.v0.9.4"}, {Name: "version", Value: ""}},
				Samples: []prompb.Sample{{Value: 1, Timestamp: 1700000000000}, {Value: math.Inf(-1), Timestamp: -5}},
				Exemplars: []prompb.Exemplar{{
					Labels: []prompb.Label{{Name: "trace_id", Value: "abc"}}, Value: 2, Timestamp: 3,
				}},
			},
			{},
			{
				Labels:     []prompb.Label{{Name: "__name__", Value: "h"}},
				Histograms: []prompb.Histogram{{Count: &prompb.Histogram_CountInt{CountInt: 4}, Sum: 1.5, Schema: 1, Timestamp: 7, PositiveDeltas: []int64{1, 2}, PositiveSpans: []prompb.BucketSpan{{Offset: 0, Length: 2}}}},
			},
		},
		Metadata: []prompb.MetricMetadata{{Type: prompb.MetricMetadata_COUNTER, MetricFamilyName: "x_total", Help: "h", Unit: "s"}},
	}
	raw, err := full.Marshal()
	require.NoError(t, err)
	return [][]byte{
		raw,
		{},
		{0x0a, 0x00},                   // one empty series
		{0x0a, 0x02, 0x0a, 0x00},       // a series with one empty label
		{0x10, 0x01, 0x0a, 0x00},       // unknown varint field, then a series
		{0x1b, 0x08, 0x01, 0x1c},       // an unknown group
		{0x0a, 0x04, 0x12, 0x02, 0x10}, // a truncated sample
		{0x0a, 0x03, 0x0a, 0x01, 0x0c}, // end group inside a label
		{0x0b},                         // field 1 as a group
		{0x0a, 0x05, 0x0a, 0x03, 0x12, 0x01, 0xff}, // a value that is not UTF-8
	}
}

// normalized makes a decoded request comparable: the generated code keeps
// unknown fields and leaves empty slices nil.
func normalized(r *prompb.WriteRequest) prompb.WriteRequest {
	out := prompb.WriteRequest{Metadata: slices.Clip(r.Metadata)}
	for _, ts := range r.Timeseries {
		n := prompb.TimeSeries{Exemplars: ts.Exemplars, Histograms: ts.Histograms}
		for _, l := range ts.Labels {
			n.Labels = append(n.Labels, prompb.Label{Name: l.Name, Value: l.Value})
		}
		for _, s := range ts.Samples {
			n.Samples = append(n.Samples, prompb.Sample{Value: s.Value, Timestamp: s.Timestamp})
		}
		for i := range n.Exemplars {
			n.Exemplars[i].XXX_unrecognized = nil
		}
		out.Timeseries = append(out.Timeseries, n)
	}
	if len(out.Metadata) == 0 {
		out.Metadata = nil
	}
	return out
}

// FuzzDecodeV1MatchesGenerated holds the hand-written decoder to the
// generated prompb code: the same input is accepted or refused by both, and
// decodes to the same request, also when the decoder's storage is reused.
func FuzzDecodeV1MatchesGenerated(f *testing.F) {
	for _, s := range v1Seeds(f) {
		f.Add(s)
	}
	var d v1Request
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want prompb.WriteRequest
		wantErr := want.Unmarshal(raw)
		err := decodeV1(raw, &d)
		if errors.Is(err, errTooLarge) { // the expansion bound, which the generated code does not have
			// It cannot be reached below a few KiB (the budget has 1 MiB of slack).
			require.Greater(t, len(raw), 16<<10, "a small request refused as too large: %v", err)
			return
		}
		if wantErr != nil {
			require.Error(t, err, "generated code refuses it: %v", wantErr)
			return
		}
		require.NoError(t, err)
		if !floatsEqual(normalized(&want), normalized(&d.req)) {
			require.Equal(t, normalized(&want), normalized(&d.req))
		}
	})
}

// floatsEqual is require.Equal that also holds NaN equal to itself.
func floatsEqual(a, b prompb.WriteRequest) bool {
	raw1, err1 := a.Marshal()
	raw2, err2 := b.Marshal()
	return err1 == nil && err2 == nil && slices.Equal(raw1, raw2)
}

func TestDecodeV1ReusesStorageWithoutLeaks(t *testing.T) {
	var d v1Request
	big := prompb.WriteRequest{}
	for i := range 100 {
		big.Timeseries = append(big.Timeseries, series("m", "i", string(rune('a'+i%26))))
	}
	small := prompb.WriteRequest{Timeseries: []prompb.TimeSeries{series("only", "k", "v")}}
	for _, req := range []prompb.WriteRequest{big, small, big} {
		raw, err := req.Marshal()
		require.NoError(t, err)
		require.NoError(t, decodeV1(raw, &d))
		require.Equal(t, normalized(&req), normalized(&d.req))
	}
	// Appending to one series' labels must not touch the next one's.
	ls := append(d.req.Timeseries[0].Labels, prompb.Label{Name: "z", Value: "z"})
	require.Len(t, ls, 3)
	require.Equal(t, normalized(&big).Timeseries[1].Labels, d.req.Timeseries[1].Labels)

	require.ErrorIs(t, decodeV1([]byte{0x0a, 0x05}, &d), errBadRequest)
	require.Empty(t, d.req.Timeseries, "a failed decode leaves nothing behind")
}

// TestHandlerKeepsNothingAliasingTheBody writes through the real storage and
// limiter, overwrites every request buffer as soon as the request is
// answered, and then checks that what was kept (TSDB series, metadata, the
// limiter's per-metric counts) is intact.
func TestHandlerKeepsNothingAliasingTheBody(t *testing.T) {
	db, err := storage.Open(discard(), nil, t.TempDir(), storage.Config{FlushOnShutdown: ptr(false), UploadOnShutdown: ptr(false)})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	lim := newLimiter(func(s *limits.Spec) { s.MaxSeriesPerMetric = ptr(2) })
	h := NewHandler(discard(), nil, db, lim, Options{})
	h.release = func(b *bytesBuffer) {
		scribble(b.decoded[:cap(b.decoded)])
		scribble(b.body.Bytes())
	}
	id := &auth.Identity{Tenant: "t", ClusterID: "c1"}
	send := func(req *prompb.WriteRequest) int {
		raw, err := req.Marshal()
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(snappy.Encode(nil, raw), id))
		return rec.Code
	}
	withSample := func(ts prompb.TimeSeries) prompb.TimeSeries {
		ts.Samples = []prompb.Sample{{Value: 1, Timestamp: 1000}}
		return ts
	}
	first := &prompb.WriteRequest{
		Timeseries: []prompb.TimeSeries{
			withSample(prompb.TimeSeries{Labels: []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "etcd"}}}),
			withSample(prompb.TimeSeries{Labels: []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "olm"}}}),
		},
		Metadata: []prompb.MetricMetadata{{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: "csv_succeeded", Help: "CSV state"}},
	}
	require.Equal(t, http.StatusNoContent, send(first))

	// The limiter counted 2 series of csv_succeeded under its own copy of
	// the name: a third is refused.
	third := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		withSample(prompb.TimeSeries{Labels: []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "third"}}}),
	}}
	require.Equal(t, http.StatusBadRequest, send(third))

	require.Equal(t, []string{
		`{__name__="csv_succeeded", _id="c1", name="etcd"}`,
		`{__name__="csv_succeeded", _id="c1", name="olm"}`,
	}, storedSeries(t, db, "t"))
	md, err := db.Metadata("t", "", -1)
	require.NoError(t, err)
	require.Contains(t, md, "csv_succeeded")
	require.Equal(t, "CSV state", md["csv_succeeded"][0].Help)
}

func scribble(b []byte) {
	for i := range b {
		b[i] = 'X'
	}
}

// A request of millions of tiny series must not pin its memory in the pool.
func TestHugeRequestBuffersAreNotPooled(t *testing.T) {
	var b bytesBuffer
	require.True(t, b.poolable())
	// A series of one label, __name__="up": 18 bytes (an empty series, 2
	// bytes, is refused as an expansion).
	series := append([]byte{0x0a, 0x10, 0x0a, 0x0e, 0x0a, 0x08}, "__name__\x12\x02up"...)
	raw := make([]byte, 0, len(series)*(maxPooledSeries+1))
	for range maxPooledSeries + 1 {
		raw = append(raw, series...)
	}
	require.NoError(t, decodeV1(raw, &b.v1))
	require.Len(t, b.v1.req.Timeseries, maxPooledSeries+1)
	require.False(t, b.poolable())
}

// TestDecodeRefusesExpansion: the smallest elements (an empty label or
// sample: 2 bytes on the wire, 48–64 decoded) cannot make a request under
// max_decoded_bytes take gigabytes; past the budget it is too large (413).
// A request of more samples than the limits admit stops at maxSamples.
func TestDecodeRefusesExpansion(t *testing.T) {
	var d v1Request
	labels := bytes.Repeat([]byte{0x0a, 0x00}, 1<<20) // a million empty labels: 2 MiB
	raw := append(protowire.AppendVarint([]byte{0x0a}, uint64(len(labels))), labels...)
	require.ErrorIs(t, decodeV1(raw, &d), errTooLarge)
	require.Empty(t, d.req.Timeseries)

	samples := bytes.Repeat([]byte{0x12, 0x00}, 1000)
	raw = append(protowire.AppendVarint([]byte{0x0a}, uint64(len(samples))), samples...)
	require.NoError(t, decodeV1(raw, &d))
	d.maxSamples = 999
	require.ErrorIs(t, decodeV1(raw, &d), errTooLarge)
}

// TestDecodeAcceptsNativeHistograms: what a Prometheus with native
// histograms sends in 1.0 (2000 per request, 160 buckets each: its default
// max_samples_per_send and bucket limit) stays inside the expansion bound.
func TestDecodeAcceptsNativeHistograms(t *testing.T) {
	h := &histogram.Histogram{Schema: 3, Count: 1000, Sum: 123.4, ZeroThreshold: 1e-128,
		PositiveSpans: []histogram.Span{{Offset: -80, Length: 160}}, PositiveBuckets: make([]int64, 160)}
	for i := range h.PositiveBuckets {
		h.PositiveBuckets[i] = int64(i%7) - 3
	}
	req := prompb.WriteRequest{}
	for i := range 2000 {
		req.Timeseries = append(req.Timeseries, prompb.TimeSeries{
			Labels:     []prompb.Label{{Name: "__name__", Value: "rpc_seconds"}, {Name: "instance", Value: fmt.Sprintf("10.0.%d.%d:9090", i/250, i%250)}, {Name: "job", Value: "api"}},
			Histograms: []prompb.Histogram{prompb.FromIntHistogram(1767268800000, h)},
		})
	}
	raw, err := req.Marshal()
	require.NoError(t, err)
	var d v1Request
	require.NoError(t, decodeV1(raw, &d))
	require.Len(t, d.req.Timeseries, 2000)
}
