package receive

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
)

// v2Seeds are requests with every field the decoder handles itself or hands
// to the generated code, and inputs on the edges of what it accepts.
func v2Seeds(t testing.TB) [][]byte {
	b := newV2()
	b.series(labels.FromStrings("__name__", "csv_succeeded", "name", "etcd", "version", ""), func(ts *writev2.TimeSeries) {
		ts.Samples = []writev2.Sample{{Value: 1, Timestamp: 1700000000000, StartTimestamp: 1699999990000}, {Value: math.Inf(-1), Timestamp: -5}}
		ts.Metadata = b.meta(model.MetricTypeGauge, "CSV state.", "")
		ts.Exemplars = []writev2.Exemplar{b.exemplar(2, 3, "trace_id", "abc")}
	})
	b.series(labels.FromStrings("__name__", "rpc_seconds"), func(ts *writev2.TimeSeries) {
		ts.Histograms = []writev2.Histogram{writev2.FromIntHistogram(0, 7, tsdbutil.GenerateTestHistogram(2))}
		ts.Metadata = b.meta(model.MetricTypeHistogram, "RPC latency.", "seconds")
	})
	b.series(labels.FromStrings("__name__", "f"), func(ts *writev2.TimeSeries) {
		ts.Histograms = []writev2.Histogram{writev2.FromFloatHistogram(0, 8, tsdbutil.GenerateTestFloatHistogram(1))}
	})
	b.req.Timeseries = append(b.req.Timeseries, writev2.TimeSeries{})
	b.req.Symbols = b.st.Symbols()
	full, err := b.req.Marshal()
	require.NoError(t, err)
	return [][]byte{
		full,
		full[:len(full)-1],
		full[:len(full)/2],
		{},
		{0x22, 0x00},             // symbols: [""]
		{0x22, 0x01, 0x78},       // symbols: ["x"]
		{0x2a, 0x00},             // one empty series, no symbols
		{0x22, 0x00, 0x2a, 0x00}, // one empty series
		{0x22, 0x00, 0x2a, 0x04, 0x08, 0x01, 0x08, 0x02},                         // labels_refs not packed
		{0x22, 0x00, 0x2a, 0x04, 0x0a, 0x01, 0x81, 0x01},                         // a packed varint running past its field
		{0x22, 0x00, 0x2a, 0x05, 0x0a, 0x03, 0x01, 0x02, 0x03},                   // odd labels_refs
		{0x22, 0x00, 0x2a, 0x08, 0x2a, 0x02, 0x08, 0x02, 0x2a, 0x02, 0x18, 0x01}, // metadata twice: merged
		{0x08, 0x01, 0x22, 0x00, 0x2a, 0x02, 0x30, 0x05},                         // unknown fields in the request and the series
		{0x22, 0x00, 0x2a, 0x06, 0x12, 0x04, 0x20, 0x01, 0x10, 0x02},             // an unknown field in a sample
		{0x22, 0x00, 0x3b, 0x08, 0x01, 0x3c},                                     // an unknown group
		{0x22, 0x00, 0x2a, 0x04, 0x12, 0x02, 0x08, 0x01},                         // a sample's value with the wrong wire type
		{0x20, 0x01},                   // symbols with the wrong wire type
		{0x23},                         // symbols as a group
		{0x2a, 0x02, 0x12},             // a truncated sample
		{0x22, 0x01, 0xff, 0x2a, 0x00}, // a symbol that is not UTF-8
	}
}

// normalizedV2 makes a decoded request comparable: the generated code keeps
// unknown fields and leaves empty slices nil; this decoder does neither.
// Histograms, exemplars and metadata are the generated code's in both.
func normalizedV2(r *writev2.Request) writev2.Request {
	out := writev2.Request{Symbols: slices.Clone(r.Symbols)}
	for _, ts := range r.Timeseries {
		n := writev2.TimeSeries{
			LabelsRefs: slices.Clone(ts.LabelsRefs), Histograms: ts.Histograms, Exemplars: ts.Exemplars, Metadata: ts.Metadata,
		}
		for _, s := range ts.Samples {
			n.Samples = append(n.Samples, writev2.Sample{Value: s.Value, Timestamp: s.Timestamp, StartTimestamp: s.StartTimestamp})
		}
		out.Timeseries = append(out.Timeseries, n)
	}
	return out
}

// sameV2 is require.Equal that also holds NaN equal to itself.
func sameV2(a, b writev2.Request) bool {
	raw1, err1 := a.Marshal()
	raw2, err2 := b.Marshal()
	return err1 == nil && err2 == nil && slices.Equal(raw1, raw2)
}

// FuzzDecodeV2MatchesGenerated holds the hand-written 2.0 decoder to the
// generated writev2 code: the same input is accepted or refused by both (with
// the symbols[0] rule on top), and decodes to the same request, also when
// the decoder's storage is reused. The conversion of what was decoded is
// held to the generated code's ToLabels and ToMetadata.
func FuzzDecodeV2MatchesGenerated(f *testing.F) {
	for _, s := range v2Seeds(f) {
		f.Add(s)
	}
	var d v2Request
	lim := newLimiter(nil).For("t")
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want writev2.Request
		wantErr := want.Unmarshal(raw)
		if wantErr == nil && (len(want.Timeseries) > 0 || len(want.Symbols) > 0) && (len(want.Symbols) == 0 || want.Symbols[0] != "") {
			wantErr = errors.New("symbols[0] is not empty")
		}
		err := decodeV2(raw, &d)
		if errors.Is(err, errTooLarge) { // the expansion bound, which the generated code does not have
			// It cannot be reached below a few KiB (the budget has 1 MiB of slack).
			require.Greater(t, len(raw), 4<<10, "a small request refused as too large: %v", err)
			return
		}
		if wantErr != nil {
			require.Error(t, err, "generated code refuses it: %v", wantErr)
			require.ErrorIs(t, err, errBadRequest)
			return
		}
		require.NoError(t, err)
		if !sameV2(normalizedV2(&want), normalizedV2(&d.req)) {
			require.Equal(t, normalizedV2(&want), normalizedV2(&d.req))
		}

		b, err := convertV2(&d, &lim)
		if errors.Is(err, errTooLarge) {
			return
		}
		require.NoError(t, err)
		require.Len(t, b.series, len(want.Timeseries))
		sb := labels.NewScratchBuilder(0)
		for i, ts := range want.Timeseries {
			if b.invalid[i].serr != nil {
				require.Equal(t, len(ts.Samples)+len(ts.Histograms), b.invalid[i].samples)
				continue
			}
			ls, err := ts.ToLabels(&sb, want.Symbols)
			require.NoError(t, err, "series %d was accepted", i)
			// Without the labels of empty value, absent as in 1.0.
			require.Equal(t, sortedLabels(prompb.FromLabels(ls.WithoutEmpty(), nil)), sortedLabels(b.series[i].Labels), "series %d", i)
			md, err := ts.ToMetadata(want.Symbols)
			require.NoError(t, err, "series %d was accepted", i)
			if len(md.Help) > maxHelpBytes || len(md.Unit) > maxUnitBytes {
				md = metadata.Metadata{} // dropped, the samples kept (TestV2OversizedMetadataIsDropped)
			}
			require.Equal(t, md, b.meta[i], "series %d", i)
			require.Len(t, b.series[i].Samples, len(ts.Samples))
			for j, s := range ts.Samples {
				require.Equal(t, s.Timestamp, b.series[i].Samples[j].Timestamp)
				require.Equal(t, math.Float64bits(s.Value), math.Float64bits(b.series[i].Samples[j].Value))
			}
			require.Len(t, b.series[i].Histograms, len(ts.Histograms))
			require.Len(t, b.series[i].Exemplars, len(ts.Exemplars))
		}
	})
}

// sortedLabels orders labels by name and value, so that duplicate names,
// which an unstable sort may order either way, compare equal.
func sortedLabels(ls []prompb.Label) []prompb.Label {
	out := slices.Clone(ls)
	slices.SortFunc(out, func(a, b prompb.Label) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Value, b.Value))
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

func TestDecodeV2ReusesStorageWithoutLeaks(t *testing.T) {
	var d v2Request
	big := newV2()
	for i := range 100 {
		big.series(labels.FromStrings("__name__", "m", "i", string(rune('a'+i%26))), func(ts *writev2.TimeSeries) {
			ts.Samples = []writev2.Sample{{Value: float64(i), Timestamp: int64(i)}}
		})
	}
	small := newV2().series(labels.FromStrings("__name__", "only", "k", "v"), func(ts *writev2.TimeSeries) {
		ts.Samples = []writev2.Sample{{Value: 1, Timestamp: 2}, {Value: 3, Timestamp: 4}}
	})
	lim := newLimiter(nil).For("t")
	for _, b := range []*v2req{big, small, big} {
		b.req.Symbols = b.st.Symbols()
		raw, err := b.req.Marshal()
		require.NoError(t, err)
		require.NoError(t, decodeV2(raw, &d))
		require.Equal(t, normalizedV2(&b.req), normalizedV2(&d.req))
		conv, err := convertV2(&d, &lim)
		require.NoError(t, err)
		require.Len(t, conv.series, len(b.req.Timeseries))
		for i := range conv.series {
			require.Nil(t, conv.invalid[i].serr)
			require.Len(t, conv.series[i].Samples, len(b.req.Timeseries[i].Samples))
		}
	}
	// Appending to one series' labels (an added _id) must not touch the
	// next one's.
	conv := &d.conv.b
	next := slices.Clone(conv.series[1].Labels)
	conv.series[0].Labels = insertLabel(conv.series[0].Labels, prompb.Label{Name: "_id", Value: "c"})
	conv.series[0].Labels = append(conv.series[0].Labels, prompb.Label{Name: "z", Value: "z"})
	require.Len(t, conv.series[0].Labels, 4)
	require.Equal(t, next, conv.series[1].Labels)

	require.ErrorIs(t, decodeV2([]byte{0x2a, 0x05}, &d), errBadRequest)
	require.Empty(t, d.req.Timeseries, "a failed decode leaves nothing behind")
	require.Empty(t, d.req.Symbols)
}

// A request of millions of tiny 2.0 series must not pin its memory in the
// pool either.
func TestHugeV2RequestBuffersAreNotPooled(t *testing.T) {
	var b bytesBuffer
	raw := []byte{0x22, 0x00, 0x22, 0x08}
	raw = append(raw, "__name__\x22\x02up"...)
	for range maxPooledSeries + 1 {
		raw = append(raw, 0x2a, 0x04, 0x0a, 0x02, 0x01, 0x02) // a series of labels_refs [1, 2]
	}
	require.NoError(t, decodeV2(raw, &b.v2))
	require.Len(t, b.v2.req.Timeseries, maxPooledSeries+1)
	require.False(t, b.poolable())

	b = bytesBuffer{}
	raw = raw[:2]
	for range 1000 {
		raw = append(raw, 0x2a, 0x00)
	}
	require.NoError(t, decodeV2(raw, &b.v2))
	lim := newLimiter(nil).For("t")
	_, err := convertV2(&b.v2, &lim)
	require.NoError(t, err)
	require.True(t, b.poolable())
}

// TestHandlerKeepsNothingAliasingTheV2Body is TestHandlerKeepsNothingAliasingTheBody
// for remote-write 2.0, whose symbols alias the body: series, per-series
// metadata (under the metric family name) and the limiter's counts must
// survive the request buffers being overwritten.
func TestHandlerKeepsNothingAliasingTheV2Body(t *testing.T) {
	db, err := storage.Open(discard(), nil, t.TempDir(), storage.Config{
		MaxExemplars: 10, FlushOnShutdown: ptr(false), UploadOnShutdown: ptr(false),
	})
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	lim := newLimiter(func(s *limits.Spec) { s.MaxSeriesPerMetric = ptr(2) })
	h := NewHandler(discard(), nil, db, lim, Options{})
	h.release = func(b *bytesBuffer) {
		scribble(b.decoded[:cap(b.decoded)])
		scribble(b.body.Bytes())
	}
	id := &auth.Identity{Tenant: "t", ClusterID: "c1"}
	send := func(b *v2req) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequestV2(b.encode(t), id))
		return rec.Code
	}
	first := newV2()
	for _, name := range []string{"etcd", "olm"} {
		first.series(labels.FromStrings("__name__", "csv_succeeded", "name", name), func(ts *writev2.TimeSeries) {
			ts.Samples = []writev2.Sample{{Value: 1, Timestamp: 1000}}
			ts.Metadata = first.meta(model.MetricTypeGauge, "CSV state", "bytes")
			ts.Exemplars = []writev2.Exemplar{first.exemplar(1, 1000, "trace_id", "abc")}
		})
	}
	require.Equal(t, http.StatusNoContent, send(first))

	// The limiter counted 2 series of csv_succeeded under its own copy of
	// the name: a third is refused.
	third := newV2().series(labels.FromStrings("__name__", "csv_succeeded", "name", "third"), func(ts *writev2.TimeSeries) {
		ts.Samples = []writev2.Sample{{Value: 1, Timestamp: 1000}}
	})
	require.Equal(t, http.StatusBadRequest, send(third))

	require.Equal(t, []string{
		`{__name__="csv_succeeded", _id="c1", name="etcd"}`,
		`{__name__="csv_succeeded", _id="c1", name="olm"}`,
	}, storedSeries(t, db, "t"))
	md, err := db.Metadata("t", "", -1)
	require.NoError(t, err)
	require.Equal(t, map[string][]metadata.Metadata{
		"csv_succeeded": {{Type: model.MetricTypeGauge, Help: "CSV state", Unit: "bytes"}},
	}, md)
}

// The copies kept from one request to the next are bounded.
func TestV2InternedSymbolsAreBounded(t *testing.T) {
	var c v2Conversion
	long := strings.Repeat("h", maxInternedSymbol+1)
	require.Equal(t, long, c.intern(long))
	require.Empty(t, c.interned, "long symbols are not kept")
	for i := range 3 * maxInterned {
		s := fmt.Sprintf("help text %d", i)
		require.Equal(t, s, c.intern(s))
		require.LessOrEqual(t, len(c.interned), maxInterned)
		require.LessOrEqual(t, c.internedBytes, maxInternedBytes)
	}
	big := strings.Repeat("b", maxInternedSymbol)
	for i := range 2 * maxInternedBytes / maxInternedSymbol {
		s := big[i%10:] + fmt.Sprint(i)
		require.Equal(t, s, c.intern(s))
		require.LessOrEqual(t, c.internedBytes, maxInternedBytes)
	}
}

// TestDecodeV2RefusesExpansion: 2-byte empty samples (56 bytes decoded,
// 48 more converted) cannot expand a request without bound.
func TestDecodeV2RefusesExpansion(t *testing.T) {
	var d v2Request
	samples := bytes.Repeat([]byte{0x12, 0x00}, 1<<20)
	raw := append([]byte{0x22, 0x00, 0x2a}, protowire.AppendVarint(nil, uint64(len(samples)))...)
	raw = append(raw, samples...)
	require.NoError(t, decodeV2(raw, &d)) // 56 bytes a sample: 28×
	lim := limits.DefaultTenantLimits()
	_, err := convertV2(&d, &lim) // and 48 more in prompb's form
	require.ErrorIs(t, err, errTooLarge)
}
