package receive

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/units"
	"github.com/golang/snappy"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
)

const contentTypeV2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"

// v2req builds a remote-write 2.0 request with a real symbol table.
type v2req struct {
	st  writev2.SymbolsTable
	req writev2.Request
}

func newV2() *v2req { return &v2req{st: writev2.NewSymbolTable()} }

// series adds a series of name and label pairs; mod fills the rest.
func (b *v2req) series(ls labels.Labels, mod func(ts *writev2.TimeSeries)) *v2req {
	ts := writev2.TimeSeries{LabelsRefs: b.st.SymbolizeLabels(ls, nil)}
	if mod != nil {
		mod(&ts)
	}
	b.req.Timeseries = append(b.req.Timeseries, ts)
	return b
}

func (b *v2req) meta(t model.MetricType, help, unit string) writev2.Metadata {
	return writev2.Metadata{Type: writev2.FromMetadataType(t), HelpRef: b.st.Symbolize(help), UnitRef: b.st.Symbolize(unit)}
}

func (b *v2req) exemplar(v float64, ts int64, ls ...string) writev2.Exemplar {
	return writev2.Exemplar{LabelsRefs: b.st.SymbolizeLabels(labels.FromStrings(ls...), nil), Value: v, Timestamp: ts}
}

// encode marshals and snappy-compresses the request; symbols are the
// table's unless the request already set its own.
func (b *v2req) encode(t testing.TB) []byte {
	t.Helper()
	if b.req.Symbols == nil {
		b.req.Symbols = b.st.Symbols()
	}
	raw, err := b.req.Marshal()
	require.NoError(t, err)
	return snappy.Encode(nil, raw)
}

func newRequestV2(body []byte, id *auth.Identity) *http.Request {
	r := newRequest(body, id)
	r.Header.Set("Content-Type", contentTypeV2)
	r.Header.Set("X-Prometheus-Remote-Write-Version", "2.0.0")
	return r
}

func openStorage(t *testing.T, maxExemplars int) *storage.DB {
	t.Helper()
	db, err := storage.Open(discard(), nil, t.TempDir(), storage.Config{MaxExemplars: maxExemplars})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

// TestDecodeV2 runs the spec's valid and invalid 2.0 requests through the
// handler into a real TSDB and checks status, exact written counts and the
// body.
func TestDecodeV2(t *testing.T) {
	now := time.Now().UnixMilli()
	up := labels.FromStrings("__name__", "up", "job", "a")
	sample := func(ts *writev2.TimeSeries) { ts.Samples = []writev2.Sample{{Value: 1, Timestamp: now}} }
	hist := tsdbutil.GenerateTestHistogram(3)
	fhist := tsdbutil.GenerateTestFloatHistogram(3)
	acme := &auth.Identity{Tenant: "acme"}

	type counts struct{ samples, histograms, exemplars int }
	for _, tc := range []struct {
		name      string
		body      func() []byte
		exemplars int // max_exemplars of the storage
		want      int
		written   counts
		msg       string
		meta      map[string][]metadata.Metadata
	}{
		{name: "samples with metadata", body: func() []byte {
			b := newV2()
			return b.series(labels.FromStrings("__name__", "http_requests_total", "code", "200"), func(ts *writev2.TimeSeries) {
				ts.Samples = []writev2.Sample{{Value: 1, Timestamp: now - 1000}, {Value: 2, Timestamp: now}}
				ts.Metadata = b.meta(model.MetricTypeCounter, "Requests served.", "")
			}).encode(t)
		}, want: 204, written: counts{samples: 2}, meta: map[string][]metadata.Metadata{
			"http_requests_total": {{Type: model.MetricTypeCounter, Help: "Requests served."}},
		}},
		{name: "empty request", body: func() []byte { return newV2().encode(t) }, want: 204},
		{name: "integer native histogram with metadata", body: func() []byte {
			b := newV2()
			return b.series(labels.FromStrings("__name__", "rpc_seconds"), func(ts *writev2.TimeSeries) {
				ts.Histograms = []writev2.Histogram{writev2.FromIntHistogram(0, now, hist)}
				ts.Metadata = b.meta(model.MetricTypeHistogram, "RPC latency.", "seconds")
			}).encode(t)
		}, want: 204, written: counts{histograms: 1}, meta: map[string][]metadata.Metadata{
			"rpc_seconds": {{Type: model.MetricTypeHistogram, Help: "RPC latency.", Unit: "seconds"}},
		}},
		{name: "float native histogram", body: func() []byte {
			return newV2().series(labels.FromStrings("__name__", "rpc_seconds"), func(ts *writev2.TimeSeries) {
				ts.Histograms = []writev2.Histogram{writev2.FromFloatHistogram(0, now, fhist)}
			}).encode(t)
		}, want: 204, written: counts{histograms: 1}},
		{name: "start timestamps, set and unset (0)", body: func() []byte {
			return newV2().series(up, func(ts *writev2.TimeSeries) {
				ts.Samples = []writev2.Sample{{Value: 1, Timestamp: now - 1000, StartTimestamp: 0}, {Value: 2, Timestamp: now, StartTimestamp: now - 60_000}}
			}).encode(t)
		}, want: 204, written: counts{samples: 2}},
		{name: "exemplars stored when enabled", exemplars: 10, body: func() []byte {
			b := newV2()
			return b.series(up, func(ts *writev2.TimeSeries) {
				sample(ts)
				ts.Exemplars = []writev2.Exemplar{b.exemplar(1, now, "trace_id", "abc")}
			}).encode(t)
		}, want: 204, written: counts{samples: 1, exemplars: 1}},
		{name: "exemplars refused when disabled: not 2xx", body: func() []byte {
			b := newV2()
			return b.series(up, func(ts *writev2.TimeSeries) {
				sample(ts)
				ts.Exemplars = []writev2.Exemplar{b.exemplar(1, now, "trace_id", "abc")}
			}).encode(t)
		}, want: 400, written: counts{samples: 1}, msg: "1 exemplars not stored"},
		{name: "unsorted label refs are sorted", body: func() []byte {
			b := newV2()
			b.req.Timeseries = []writev2.TimeSeries{{
				LabelsRefs: []uint32{b.st.Symbolize("job"), b.st.Symbolize("a"), b.st.Symbolize("__name__"), b.st.Symbolize("up")},
				Samples:    []writev2.Sample{{Value: 1, Timestamp: now}},
			}}
			return b.encode(t)
		}, want: 204, written: counts{samples: 1}},

		{name: "symbols[0] not empty", body: func() []byte {
			b := newV2().series(up, sample)
			b.req.Symbols = append([]string{"x"}, b.st.Symbols()[1:]...)
			return b.encode(t)
		}, want: 400, msg: "symbols[0] must be the empty string"},
		{name: "series without a symbol table", body: func() []byte {
			b := newV2().series(up, sample)
			b.req.Symbols = []string{}
			raw, err := b.req.Marshal()
			require.NoError(t, err)
			return snappy.Encode(nil, raw)
		}, want: 400, msg: "symbols[0]"},
		{name: "label ref out of range: partial write", body: func() []byte {
			b := newV2().series(up, sample)
			b.req.Timeseries = append(b.req.Timeseries, writev2.TimeSeries{LabelsRefs: []uint32{1, 999}, Samples: []writev2.Sample{{Value: 1, Timestamp: now}}})
			return b.encode(t)
		}, want: 400, written: counts{samples: 1}, msg: "series 1: labels: labelRefs 1 (name) = 999 (value) outside of symbols table"},
		{name: "odd labels_refs length", body: func() []byte {
			b := newV2().series(up, sample)
			b.req.Timeseries[0].LabelsRefs = b.req.Timeseries[0].LabelsRefs[:3]
			return b.encode(t)
		}, want: 400, msg: "invalid labelRefs length 3"},
		{name: "metadata help ref out of range", body: func() []byte {
			return newV2().series(up, func(ts *writev2.TimeSeries) {
				sample(ts)
				ts.Metadata = writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGE, HelpRef: 1000}
			}).encode(t)
		}, want: 400, msg: "help_ref 1000 outside of symbols table"},
		{name: "exemplar ref out of range", exemplars: 10, body: func() []byte {
			return newV2().series(up, func(ts *writev2.TimeSeries) {
				sample(ts)
				ts.Exemplars = []writev2.Exemplar{{LabelsRefs: []uint32{0, 77}, Value: 1, Timestamp: now}}
			}).encode(t)
		}, want: 400, msg: "exemplar: labelRefs"},
		{name: "samples and histograms in one series", body: func() []byte {
			return newV2().series(up, func(ts *writev2.TimeSeries) {
				sample(ts)
				ts.Histograms = []writev2.Histogram{writev2.FromIntHistogram(0, now, hist)}
			}).encode(t)
		}, want: 400, msg: "both samples and histograms"},
		{name: "neither samples nor histograms", body: func() []byte {
			return newV2().series(up, nil).encode(t)
		}, want: 400, msg: "no samples"},
		{name: "no metric name", body: func() []byte {
			return newV2().series(labels.FromStrings("job", "a"), sample).encode(t)
		}, want: 400, msg: "no metric name"},
		{name: "duplicate label names", body: func() []byte {
			b := newV2()
			b.req.Timeseries = []writev2.TimeSeries{{
				LabelsRefs: []uint32{b.st.Symbolize("__name__"), b.st.Symbolize("up"), b.st.Symbolize("a"), b.st.Symbolize("1"), b.st.Symbolize("a"), b.st.Symbolize("2")},
				Samples:    []writev2.Sample{{Value: 1, Timestamp: now}},
			}}
			return b.encode(t)
		}, want: 400, msg: "duplicate label name"},
		{name: "invalid native histogram: partial write", body: func() []byte {
			bad := hist.Copy()
			bad.Count = 1 // the buckets hold more
			return newV2().series(up, sample).series(labels.FromStrings("__name__", "h"), func(ts *writev2.TimeSeries) {
				ts.Histograms = []writev2.Histogram{writev2.FromIntHistogram(0, now, bad)}
			}).encode(t)
		}, want: 400, written: counts{samples: 1}, msg: "invalid sample"},
		{name: "garbage protobuf", body: func() []byte { return snappy.Encode(nil, []byte{0xff, 0xff, 0xff}) }, want: 400, msg: "protobuf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := openStorage(t, tc.exemplars)
			h := NewHandler(discard(), nil, db, newLimiter(nil), Options{})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, newRequestV2(tc.body(), acme))
			require.Equal(t, tc.want, rec.Code, rec.Body.String())
			require.Contains(t, rec.Body.String(), tc.msg)
			require.Equal(t, strconv.Itoa(tc.written.samples), rec.Header().Get(headerSamplesWritten))
			require.Equal(t, strconv.Itoa(tc.written.histograms), rec.Header().Get(headerHistogramsWritten))
			require.Equal(t, strconv.Itoa(tc.written.exemplars), rec.Header().Get(headerExemplarsWritten))
			if tc.meta != nil {
				got, err := db.Metadata("acme", "", -1)
				require.NoError(t, err)
				require.Equal(t, tc.meta, got)
			}
		})
	}
}

func TestNegotiate(t *testing.T) {
	v1Only := []string{protoV1}
	for _, tc := range []struct {
		ct, enc  string
		accepted []string
		want     string // "" means 415
	}{
		{"", "", nil, protoV1},
		{"application/x-protobuf", "snappy", nil, protoV1},
		{"application/x-protobuf;proto=prometheus.WriteRequest", "snappy", nil, protoV1},
		{"application/x-protobuf; proto=io.prometheus.write.v2.Request", "snappy", nil, protoV2},
		{"application/x-protobuf;proto=io.prometheus.write.v2.Request", "snappy", v1Only, ""},
		{"application/x-protobuf", "snappy", v1Only, protoV1},
		{"application/x-protobuf;proto=io.prometheus.write.v2.Request", "zstd", nil, ""},
		{"application/x-protobuf;proto=io.prometheus.write.v3.Request", "snappy", nil, ""},
		{"application/x-protobuf;proto=", "snappy", nil, ""},
		{"application/json", "snappy", nil, ""},
		{"application/x-protobuf;proto", "snappy", nil, ""},
		{"not a media type;;", "snappy", nil, ""},
	} {
		h := http.Header{}
		if tc.ct != "" {
			h.Set("Content-Type", tc.ct)
		}
		h.Set("Content-Encoding", tc.enc)
		got, err := negotiate(h, tc.accepted)
		if tc.want == "" {
			require.ErrorIs(t, err, errUnsupported, "%q %q", tc.ct, tc.enc)
			require.Equal(t, http.StatusUnsupportedMediaType, statusFor(err))
			if !strings.HasPrefix(tc.ct, "application/x-protobuf") && tc.enc == "snappy" {
				require.ErrorContains(t, err, "want application/x-protobuf", "the answer names what is accepted")
			}
			if tc.enc == "snappy" {
				require.ErrorContains(t, err, protoV1, "the answer names the protos accepted, for a malformed proto parameter too")
			}
			continue
		}
		require.NoError(t, err, "%q", tc.ct)
		require.Equal(t, tc.want, got, "%q", tc.ct)
	}
}

func TestV2RefusedWhenOnlyV1Accepted(t *testing.T) {
	h := NewHandler(discard(), nil, discardWriter{}, newLimiter(nil), Options{AcceptedMessages: []string{protoV1}})
	rec := httptest.NewRecorder()
	body := newV2().series(labels.FromStrings("__name__", "up"), func(ts *writev2.TimeSeries) {
		ts.Samples = []writev2.Sample{{Value: 1, Timestamp: 1}}
	}).encode(t)
	h.ServeHTTP(rec, newRequestV2(body, &auth.Identity{Tenant: "a"}))
	require.Equal(t, http.StatusUnsupportedMediaType, rec.Code)
	require.Equal(t, "0", rec.Header().Get(headerSamplesWritten))
}

// TestV2SameAdmissionAsV1 sends the same series as 1.0 and 2.0: _id binding,
// the allowlist and the series limit decide identically.
func TestV2SameAdmissionAsV1(t *testing.T) {
	cfg := &Config{Allowlist: []string{`{__name__=~"up|kept"}`}}
	pol, err := NewPolicy(cfg)
	require.NoError(t, err)
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	ls := []labels.Labels{
		labels.FromStrings("__name__", "up", "job", "a"),              // kept, _id added
		labels.FromStrings("__name__", "up", "_id", "c2", "job", "b"), // another cluster's _id
		labels.FromStrings("__name__", "dropped", "job", "a"),         // outside the allowlist
		labels.FromStrings("__name__", "kept", "job", "a"),            // over the series limit (2)
		labels.FromStrings("__name__", "kept", "job", "b"),
	}
	run := func(v2 bool) (*fakeWriter, *httptest.ResponseRecorder) {
		w := &fakeWriter{}
		lim := newLimiter(func(s *limits.Spec) { s.MaxSeriesPerCluster = ptr(2) })
		h := NewHandler(discard(), nil, w, lim, Options{Policy: pol})
		var r *http.Request
		if v2 {
			b := newV2()
			for _, l := range ls {
				b.series(l, func(ts *writev2.TimeSeries) { ts.Samples = []writev2.Sample{{Value: 1, Timestamp: 1000}} })
			}
			r = newRequestV2(b.encode(t), id)
		} else {
			var tss []prompb.TimeSeries
			for _, l := range ls {
				tss = append(tss, prompb.TimeSeries{Labels: prompb.FromLabels(l, nil), Samples: []prompb.Sample{{Value: 1, Timestamp: 1000}}})
			}
			r = newRequest(encode(t, tss...), id)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return w, rec
	}
	w1, rec1 := run(false)
	w2, rec2 := run(true)
	require.Equal(t, http.StatusBadRequest, rec1.Code)
	require.Equal(t, rec1.Code, rec2.Code)
	require.Equal(t, "2", rec2.Header().Get(headerSamplesWritten))
	require.Len(t, w1.series, 2, "the same two written for 1.0 (whose responses carry no counts)")
	require.Equal(t, rec1.Body.String(), rec2.Body.String())
	require.Equal(t, w1.series, w2.series)
}

// FuzzDecodeWriteRequestV2: no panic and no 5xx for any 2.0 body, and the
// written counts never exceed what the request carried.
func FuzzDecodeWriteRequestV2(f *testing.F) {
	now := time.Now().UnixMilli()
	b := newV2()
	b.series(labels.FromStrings("__name__", "up", "job", "a"), func(ts *writev2.TimeSeries) {
		ts.Samples = []writev2.Sample{{Value: 1, Timestamp: now, StartTimestamp: now - 1}}
		ts.Metadata = b.meta(model.MetricTypeGauge, "Up.", "")
		ts.Exemplars = []writev2.Exemplar{b.exemplar(1, now, "trace_id", "x")}
	})
	b.series(labels.FromStrings("__name__", "h"), func(ts *writev2.TimeSeries) {
		ts.Histograms = []writev2.Histogram{writev2.FromIntHistogram(0, now, tsdbutil.GenerateTestHistogram(1))}
	})
	b.series(labels.FromStrings("__name__", "fh"), func(ts *writev2.TimeSeries) {
		ts.Histograms = []writev2.Histogram{writev2.FromFloatHistogram(0, now, tsdbutil.GenerateTestFloatHistogram(1))}
	})
	f.Add(b.encode(f))
	f.Add(newV2().encode(f))
	f.Add([]byte{})
	f.Add(snappy.Encode(nil, []byte{0x22, 0x01, 0x78})) // symbols: ["x"]
	f.Add(snappy.Encode(nil, []byte{0x2a, 0x02, 0x0a, 0x01}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	h := NewHandler(discard(), nil, discardWriter{}, newLimiter(func(s *limits.Spec) {
		s.MaxBodyBytes, s.MaxDecodedBytes = ptr(units.Base2Bytes(1<<16)), ptr(units.Base2Bytes(1<<20))
	}), Options{})
	id := &auth.Identity{Tenant: "a", ClusterID: "c"}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequestV2(body, id))
		if rec.Code >= 500 {
			t.Fatalf("client input answered %d: %s", rec.Code, rec.Body)
		}
		written, _ := strconv.Atoi(rec.Header().Get(headerSamplesWritten))
		if rec.Code/100 != 2 && rec.Code != 400 && written != 0 {
			t.Fatalf("%d with %d samples written", rec.Code, written)
		}
	})
}

// TestV2OversizedMetadataIsDropped: as in 1.0, help over maxHelpBytes (or a
// unit over maxUnitBytes) is dropped and counted, the samples kept. Storage
// logs each series' metadata in the WAL: every series of a request
// referencing one large help symbol would otherwise write it once each.
func TestV2OversizedMetadataIsDropped(t *testing.T) {
	req := writev2.Request{Symbols: []string{"", "__name__", "up", "_id", "c1", strings.Repeat("h", maxHelpBytes+1), "Up."}}
	for _, help := range []uint32{5, 5, 6} {
		req.Timeseries = append(req.Timeseries, writev2.TimeSeries{
			LabelsRefs: []uint32{1, 2, 3, 4},
			Samples:    []writev2.Sample{{Value: 1, Timestamp: 1}},
			Metadata:   writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGE, HelpRef: help},
		})
	}
	_, b := convertedV2(t, &req)
	require.Equal(t, 2, b.invalidMeta)
	require.Equal(t, metadata.Metadata{}, b.meta[0])
	require.Equal(t, metadata.Metadata{Type: model.MetricTypeGauge, Help: "Up."}, b.meta[2])
	for _, s := range b.series {
		require.Len(t, s.Samples, 1, "the samples are kept")
	}
}

// convertedV2 decodes and converts req under the default limits.
func convertedV2(t *testing.T, req *writev2.Request) (*v2Request, *batch) {
	t.Helper()
	raw, err := req.Marshal()
	require.NoError(t, err)
	var d v2Request
	require.NoError(t, decodeV2(raw, &d))
	lim := limits.DefaultTenantLimits()
	b, err := convertV2(&d, &lim)
	require.NoError(t, err)
	return &d, b
}
