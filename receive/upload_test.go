package receive

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/alecthomas/units"
	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

// delimited encodes families as telemeter-client does before compressing.
func delimited(t testing.TB, fams ...*dto.MetricFamily) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, f := range fams {
		_, err := protodelim.MarshalTo(&b, f)
		require.NoError(t, err)
	}
	return b.Bytes()
}

// framed compresses raw in snappy's framing format, as telemeter-client's
// snappy.NewBufferedWriter does.
func framed(t testing.TB, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := snappy.NewBufferedWriter(&b)
	_, err := w.Write(raw)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return b.Bytes()
}

func gauge(name string, v float64, ts int64, pairs ...string) *dto.MetricFamily {
	m := &dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(v)}}
	if ts != 0 {
		m.TimestampMs = proto.Int64(ts)
	}
	for i := 0; i+1 < len(pairs); i += 2 {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(pairs[i]), Value: proto.String(pairs[i+1])})
	}
	return &dto.MetricFamily{Name: proto.String(name), Type: dto.MetricType_GAUGE.Enum(), Metric: []*dto.Metric{m}}
}

func seriesStrings(series []prompb.TimeSeries) []string {
	var out []string
	for _, ts := range series {
		var b strings.Builder
		for i, l := range ts.Labels {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(l.Name + "=" + l.Value)
		}
		for _, s := range ts.Samples {
			b.WriteString(" " + formatFloat(s.Value) + "@" + formatFloat(float64(s.Timestamp)))
		}
		out = append(out, b.String())
	}
	return out
}

func TestDecodeFamiliesConvertsEveryType(t *testing.T) {
	summary := &dto.MetricFamily{
		Name: proto.String("rpc_seconds"), Type: dto.MetricType_SUMMARY.Enum(), Help: proto.String("RPC latency."),
		Metric: []*dto.Metric{{
			Label:       []*dto.LabelPair{{Name: proto.String("job"), Value: proto.String("api")}},
			TimestampMs: proto.Int64(5000),
			Summary: &dto.Summary{
				SampleCount: proto.Uint64(10), SampleSum: proto.Float64(2.5),
				Quantile: []*dto.Quantile{{Quantile: proto.Float64(0.5), Value: proto.Float64(0.2)}, {Quantile: proto.Float64(0.99), Value: proto.Float64(0.9)}},
			},
		}},
	}
	histogram := &dto.MetricFamily{
		Name: proto.String("req_seconds"), Type: dto.MetricType_HISTOGRAM.Enum(),
		Metric: []*dto.Metric{{
			TimestampMs: proto.Int64(6000),
			Histogram: &dto.Histogram{
				SampleCount: proto.Uint64(7), SampleSum: proto.Float64(3),
				Bucket: []*dto.Bucket{{UpperBound: proto.Float64(0.1), CumulativeCount: proto.Uint64(2)}, {UpperBound: proto.Float64(1), CumulativeCount: proto.Uint64(6)}},
			},
		}},
	}
	counter := &dto.MetricFamily{Name: proto.String("errors_total"), Type: dto.MetricType_COUNTER.Enum(), Metric: []*dto.Metric{
		{Counter: &dto.Counter{Value: proto.Float64(3)}, TimestampMs: proto.Int64(7000)},
	}}
	untyped := &dto.MetricFamily{Name: proto.String("csv_succeeded"), Type: dto.MetricType_UNTYPED.Enum(), Metric: []*dto.Metric{{
		// Federation sends labels sorted; __name__ sorts after upper-case names.
		Label: []*dto.LabelPair{
			{Name: proto.String("Zone"), Value: proto.String("z")},
			{Name: proto.String("name"), Value: proto.String("etcd")},
		},
		Untyped: &dto.Untyped{Value: proto.Float64(1)},
	}}}

	var d familyRequest
	require.NoError(t, decodeFamilies(delimited(t, gauge("up", 1, 1000, "job", "a"), summary, histogram, counter, untyped), &d, 9000, false))
	require.Equal(t, []string{
		"__name__=up,job=a 1@1000",
		"__name__=rpc_seconds,job=api,quantile=0.5 0.2@5000",
		"__name__=rpc_seconds,job=api,quantile=0.99 0.9@5000",
		"__name__=rpc_seconds_sum,job=api 2.5@5000",
		"__name__=rpc_seconds_count,job=api 10@5000",
		"__name__=req_seconds_bucket,le=0.1 2@6000",
		"__name__=req_seconds_bucket,le=1 6@6000",
		"__name__=req_seconds_bucket,le=+Inf 7@6000",
		"__name__=req_seconds_sum 3@6000",
		"__name__=req_seconds_count 7@6000",
		"__name__=errors_total 3@7000",
		"Zone=z,__name__=csv_succeeded,name=etcd 1@9000", // no timestamp: the receive time
	}, seriesStrings(d.series))
	require.Equal(t, []prompb.MetricMetadata{
		{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: "up"},
		{Type: prompb.MetricMetadata_SUMMARY, MetricFamilyName: "rpc_seconds", Help: "RPC latency."},
		{Type: prompb.MetricMetadata_HISTOGRAM, MetricFamilyName: "req_seconds"},
		{Type: prompb.MetricMetadata_COUNTER, MetricFamilyName: "errors_total"},
	}, d.meta, "untyped families without help carry no metadata")

	// Appending to one series' labels must not touch the next one's.
	d.series[0].Labels = append(d.series[0].Labels, prompb.Label{Name: "x", Value: "y"})
	require.Equal(t, "rpc_seconds", d.series[1].Labels[0].Value)
}

func TestDecodeFamiliesRefusesMalformedInput(t *testing.T) {
	valid := delimited(t, gauge("up", 1, 1000))
	huge := binary.AppendUvarint(nil, 1<<40)
	for name, raw := range map[string][]byte{
		"truncated message":       valid[:len(valid)-2],
		"declared length too big": append(huge, 1, 2, 3),
		"varint overflow":         bytes.Repeat([]byte{0xff}, 11),
		"family without a name":   delimited(t, &dto.MetricFamily{Type: dto.MetricType_GAUGE.Enum()}),
		"wrong wire type":         append(binary.AppendUvarint(nil, 2), 0x0d, 0x00), // name as fixed32
	} {
		t.Run(name, func(t *testing.T) {
			var d familyRequest
			err := decodeFamilies(raw, &d, 0, false)
			require.ErrorIs(t, err, errBadRequest)
			require.Empty(t, d.series, "nothing partial is kept")
		})
	}
}

func TestDecodeFamiliesBoundsExpansion(t *testing.T) {
	// One metric with many labels and many buckets: each bucket copies
	// every label, so a small body would become a huge batch.
	m := &dto.Metric{Histogram: &dto.Histogram{SampleCount: proto.Uint64(1)}}
	for i := range 60 {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String("l" + strings.Repeat("x", i)), Value: proto.String("v")})
	}
	for i := range 5000 {
		m.Histogram.Bucket = append(m.Histogram.Bucket, &dto.Bucket{UpperBound: proto.Float64(float64(i)), CumulativeCount: proto.Uint64(1)})
	}
	raw := delimited(t, &dto.MetricFamily{Name: proto.String("h"), Type: dto.MetricType_HISTOGRAM.Enum(), Metric: []*dto.Metric{m}})
	var d familyRequest
	require.ErrorIs(t, decodeFamilies(raw, &d, 0, false), errTooLarge)

	// Within one metric: 3,000 empty pairs × 3,000 empty buckets is 21 KB
	// that would expand into 9M labels. The bound holds on every series,
	// so the decoder stops at about four labels per byte.
	m = &dto.Metric{Histogram: &dto.Histogram{}}
	for range 3000 {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String("a"), Value: proto.String("")})
		m.Histogram.Bucket = append(m.Histogram.Bucket, &dto.Bucket{})
	}
	raw = delimited(t, &dto.MetricFamily{Name: proto.String("h"), Type: dto.MetricType_HISTOGRAM.Enum(), Metric: []*dto.Metric{m}})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	require.ErrorIs(t, decodeFamilies(raw, &d, 0, false), errTooLarge)
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "allocated %d bytes for a %d-byte upload", after.TotalAlloc-before.TotalAlloc, len(raw))
	require.Empty(t, d.series)
}

// uploadRequest is a telemeter-client upload of body, as it sends it:
// chunked (no Content-Length).
func uploadRequest(body []byte, id *auth.Identity) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/upload", io.MultiReader(bytes.NewReader(body)))
	r.ContentLength = -1
	r.Header.Set("Content-Type", uploadContentType)
	r.Header.Set("Content-Encoding", "snappy")
	if id != nil {
		r = r.WithContext(auth.WithIdentity(r.Context(), *id))
	}
	return r
}

func TestServeUploadRunsTheRemoteWritePipeline(t *testing.T) {
	w := &fakeWriter{}
	reg := prometheus.NewRegistry()
	h := NewHandler(discard(), reg, w, newLimiter(nil), Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}

	body := framed(t, delimited(t, gauge("up", 1, 1000, "job", "a"), gauge("up", 1, 1000, "_id", "c2")))
	rec := httptest.NewRecorder()
	h.ServeUpload(rec, uploadRequest(body, id))
	require.Equal(t, http.StatusBadRequest, rec.Code, "a series of another cluster is refused")
	require.Contains(t, rec.Body.String(), "does not match the authenticated cluster")
	require.Len(t, w.series, 1)
	require.Equal(t, "__name__=up,_id=c1,job=a", labelString(w.series[0]), "the rest is written, bound to c1")
	require.InDelta(t, 1, testutil.ToFloat64(h.metrics.rejected.WithLabelValues(reasonClusterMismatch)), 0)

	rec = httptest.NewRecorder()
	h.ServeUpload(rec, uploadRequest(framed(t, delimited(t, gauge("up", 2, 2000, "job", "a"))), id))
	require.Equal(t, http.StatusOK, rec.Code, "telemeter-client takes only 200 for success: %s", rec.Body)
	require.Equal(t, "1", rec.Header().Get(headerSamplesWritten))
	require.InDelta(t, 2, testutil.ToFloat64(h.metrics.requestsByProto.WithLabelValues(protoFamilies)), 0)

	// Uncompressed, without Content-Encoding.
	rec = httptest.NewRecorder()
	plain := uploadRequest(delimited(t, gauge("up", 4, 4000, "job", "a")), id)
	plain.Header.Del("Content-Encoding")
	h.ServeUpload(rec, plain)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())

	// Block-format snappy (what remote-write clients send) is accepted too.
	rec = httptest.NewRecorder()
	h.ServeUpload(rec, uploadRequest(snappy.Encode(nil, delimited(t, gauge("up", 3, 3000, "job", "a"))), id))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Len(t, w.series, 4)
}

// telemeter-server takes the content coding in any case (strings.EqualFold),
// as HTTP defines content codings.
func TestServeUploadContentEncodingIgnoresCase(t *testing.T) {
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	for _, enc := range []string{"Snappy", "SNAPPY"} {
		r := uploadRequest(framed(t, delimited(t, gauge("up", 1, 1000, "job", enc))), id)
		r.Header.Set("Content-Encoding", enc)
		rec := httptest.NewRecorder()
		h.ServeUpload(rec, r)
		require.Equal(t, http.StatusOK, rec.Code, "%s: %s", enc, rec.Body)
	}
	require.Len(t, w.series, 2)
}

func TestServeUploadRewritesTheClusterIDSentInClear(t *testing.T) {
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "pseudonym", ClusterIDAlias: "raw-uuid"}
	rec := httptest.NewRecorder()
	h.ServeUpload(rec, uploadRequest(framed(t, delimited(t, gauge("up", 1, 1000, "_id", "raw-uuid"))), id))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Len(t, w.series, 1)
	require.Equal(t, "__name__=up,_id=pseudonym", labelString(w.series[0]))
}

// TestUpload415NamesTheAcceptedType: a client that sent no Content-Type, or
// one that does not parse, learns what to send, as for a wrong one.
func TestUpload415NamesTheAcceptedType(t *testing.T) {
	h := NewHandler(discard(), nil, &fakeWriter{}, newLimiter(nil), Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	for _, ct := range []string{"", "text/plain", "not a media type;;"} {
		t.Run(ct, func(t *testing.T) {
			r := uploadRequest(framed(t, delimited(t, gauge("up", 1, 1000))), id)
			r.Header.Set("Content-Type", ct)
			rec := httptest.NewRecorder()
			h.ServeUpload(rec, r)
			require.Equal(t, http.StatusUnsupportedMediaType, rec.Code)
			require.Contains(t, rec.Body.String(), "want application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited")
		})
	}
}

func TestServeUploadBadInput(t *testing.T) {
	small := func(s *limits.Spec) {
		s.MaxBodyBytes = ptr(units.Base2Bytes(4 << 10))
		s.MaxDecodedBytes = ptr(units.Base2Bytes(16 << 10))
	}
	valid := framed(t, delimited(t, gauge("up", 1, 1000)))
	// 64 KiB of one byte compresses far below the body cap, and decodes
	// over the decoded cap.
	bomb := framed(t, append(binary.AppendUvarint(nil, 64<<10), bytes.Repeat([]byte{'a'}, 64<<10)...))
	random := make([]byte, 8<<10) // incompressible: stays over the 4 KiB body cap
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	cases := []struct {
		name     string
		body     []byte
		mod      func(*http.Request)
		wantCode int
	}{
		{name: "truncated frame", body: valid[:len(valid)-3], wantCode: http.StatusBadRequest},
		{name: "corrupt frame", body: append(append([]byte(nil), valid[:len(valid)-1]...), valid[len(valid)-1]^0xff), wantCode: http.StatusBadRequest},
		{name: "decoded over the cap", body: bomb, wantCode: http.StatusRequestEntityTooLarge},
		{name: "sent over the cap", body: framed(t, random), wantCode: http.StatusRequestEntityTooLarge},
		{name: "declared length over the cap", body: framed(t, append(binary.AppendUvarint(nil, 1<<30), 1, 2)), wantCode: http.StatusBadRequest},
		{name: "wrong content type", body: valid, mod: func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }, wantCode: http.StatusUnsupportedMediaType},
		{name: "wrong proto", body: valid, mod: func(r *http.Request) {
			r.Header.Set("Content-Type", "application/vnd.google.protobuf; proto=prometheus.WriteRequest; encoding=delimited")
		}, wantCode: http.StatusUnsupportedMediaType},
		{name: "gzip", body: valid, mod: func(r *http.Request) { r.Header.Set("Content-Encoding", "gzip") }, wantCode: http.StatusUnsupportedMediaType},
		{name: "not snappy", body: []byte("hello, this is not snappy"), wantCode: http.StatusBadRequest},
		{name: "uncompressed over the cap", body: bytes.Repeat([]byte{1}, 5<<10), mod: func(r *http.Request) { r.Header.Del("Content-Encoding") }, wantCode: http.StatusRequestEntityTooLarge},
	}
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(small), Options{})
	id := &auth.Identity{Tenant: "acme", ClusterID: "c1"}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := uploadRequest(tc.body, id)
			if tc.mod != nil {
				tc.mod(r)
			}
			rec := httptest.NewRecorder()
			h.ServeUpload(rec, r)
			require.Equal(t, tc.wantCode, rec.Code, rec.Body.String())
			require.Empty(t, w.series, "nothing partial is written")
		})
	}
	rec := httptest.NewRecorder()
	h.ServeUpload(rec, uploadRequest(valid, id))
	require.Equal(t, http.StatusOK, rec.Code, "the receiver keeps serving: %s", rec.Body)
}

// FuzzDecodeFamilies compares the decoder with client_model's generated
// code: what the generated code accepts, it accepts too (unless a family has
// no name) and converts into the series the families imply. It may accept
// more: it does not look inside fields it does not use (exemplars, native
// buckets, a summary in a counter family). It never panics, and refusals
// are 4xx.
func FuzzDecodeFamilies(f *testing.F) {
	f.Add(delimited(f, gauge("up", 1, 1000, "job", "a"), gauge("csv_succeeded", 0, 2, "name", "etcd", "version", "1.2")))
	f.Add(delimited(f, &dto.MetricFamily{Name: proto.String("s"), Type: dto.MetricType_SUMMARY.Enum(), Metric: []*dto.Metric{{
		Summary: &dto.Summary{SampleCount: proto.Uint64(1), Quantile: []*dto.Quantile{{Quantile: proto.Float64(0.5), Value: proto.Float64(math.NaN())}}},
	}}}))
	f.Add(delimited(f, &dto.MetricFamily{Name: proto.String("h"), Type: dto.MetricType_HISTOGRAM.Enum(), Metric: []*dto.Metric{{
		Histogram: &dto.Histogram{SampleCount: proto.Uint64(1), Bucket: []*dto.Bucket{{UpperBound: proto.Float64(math.Inf(1)), CumulativeCount: proto.Uint64(1)}}},
	}}}))
	if b, err := fixtureFamilies(); err == nil {
		f.Add(b)
	}
	f.Add([]byte{0x05, 0x0a, 0x03, 'u', 'p'})
	wide := &dto.Metric{Histogram: &dto.Histogram{}} // pairs × buckets: the expansion bound
	for range 300 {
		wide.Label = append(wide.Label, &dto.LabelPair{Name: proto.String("a"), Value: proto.String("")})
		wide.Histogram.Bucket = append(wide.Histogram.Bucket, &dto.Bucket{})
	}
	f.Add(delimited(f, &dto.MetricFamily{Name: proto.String("h"), Type: dto.MetricType_HISTOGRAM.Enum(), Metric: []*dto.Metric{wide}}))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var d familyRequest
		err := decodeFamilies(raw, &d, 42, false)
		if err != nil {
			if code := statusFor(err); code >= 500 {
				t.Fatalf("client input classified as %d: %v", code, err)
			}
		}
		want, named := 0, true
		for rest := raw; len(rest) > 0; {
			n, k := binary.Uvarint(rest)
			if k <= 0 || n > uint64(len(rest)-k) {
				return // not delimited messages: either answer is fine
			}
			var mf dto.MetricFamily
			if proto.Unmarshal(rest[k:k+int(n)], &mf) != nil {
				return // the generated code refuses it: either answer is fine
			}
			rest = rest[k+int(n):]
			named = named && mf.GetName() != ""
			want += expectedSeries(&mf)
		}
		if !named {
			require.Error(t, err, "a family without a name is refused")
			return
		}
		if errors.Is(err, errTooLarge) {
			return // the expansion bound
		}
		require.NoError(t, err, "the generated code accepts it")
		require.Len(t, d.series, want)
		for _, ts := range d.series {
			require.Len(t, ts.Samples, 1)
		}
	})
}

// expectedSeries is how many series a family converts into.
func expectedSeries(mf *dto.MetricFamily) int {
	n := 0
	for _, m := range mf.GetMetric() {
		switch mf.GetType() {
		case dto.MetricType_SUMMARY:
			n += len(m.GetSummary().GetQuantile()) + 2
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			n += len(m.GetHistogram().GetBucket()) + 2
			inf := false
			for _, b := range m.GetHistogram().GetBucket() {
				inf = inf || math.IsInf(b.GetUpperBound(), 1)
			}
			if !inf {
				n++
			}
		default:
			n++
		}
	}
	return n
}

// fixtureFamilies is the federate fixture of one cluster as telemeter-client
// would upload it.
func fixtureFamilies() ([]byte, error) {
	b, err := os.ReadFile("../bench/testdata/federate-sample.prom")
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	for _, mf := range fams {
		if _, err := protodelim.MarshalTo(&out, mf); err != nil {
			return nil, err
		}
	}
	return out.Bytes(), nil
}

// TestUploadBucketsCannotExpandWithoutBound: each empty bucket of a classic
// histogram (2 bytes) becomes a series with every label of its metric; a
// small upload of many of them is too large (413), not gigabytes of heap. An
// upload of more series than the limits admit at once stops at maxSamples.
func TestUploadBucketsCannotExpandWithoutBound(t *testing.T) {
	histogram := func(buckets int) *dto.MetricFamily {
		m := &dto.Metric{Histogram: &dto.Histogram{Bucket: make([]*dto.Bucket, buckets)}, TimestampMs: proto.Int64(1)}
		for i := range m.Histogram.Bucket {
			m.Histogram.Bucket[i] = &dto.Bucket{}
		}
		for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(n), Value: proto.String(strings.Repeat(n, 30))})
		}
		return &dto.MetricFamily{Name: proto.String("h"), Type: dto.MetricType_HISTOGRAM.Enum(), Metric: []*dto.Metric{m}}
	}
	var d familyRequest
	raw := delimited(t, histogram(500_000)) // ~1 MB
	require.ErrorIs(t, decodeFamilies(raw, &d, 1, false), errTooLarge)
	require.Empty(t, d.series)

	raw = delimited(t, histogram(100))
	require.NoError(t, decodeFamilies(raw, &d, 1, false))
	require.Len(t, d.series, 100+3) // buckets, +Inf, _sum, _count
	d.maxSamples = 100
	require.ErrorIs(t, decodeFamilies(raw, &d, 1, false), errTooLarge)
}
