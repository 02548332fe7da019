package forward

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/relabel"
)

func TestRemoteWrite2HappyPath(t *testing.T) {
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), true)
	recv := newFakeReceiver(t)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{MaxSamplesPerRequest: 100}, FederateOptions{})
	require.NoError(t, h.f.Collect(context.Background()))
	h.deliverAll(t)

	require.Len(t, recv.series(), 224)
	require.Equal(t, []string{ProtoV2, ProtoV2, ProtoV2}, recv.protos)
	for _, r := range recv.v2 {
		require.Equal(t, "", r.Symbols[0], "symbols[0] is the empty string")
		for _, ts := range r.Timeseries {
			require.Zero(t, len(ts.LabelsRefs)%2)
		}
	}
	for _, hd := range recv.headers {
		require.Equal(t, "application/x-protobuf;proto=io.prometheus.write.v2.Request", hd.Get("Content-Type"))
		require.Equal(t, "snappy", hd.Get("Content-Encoding"))
		require.Equal(t, "2.0.0", hd.Get("X-Prometheus-Remote-Write-Version"))
	}
	require.Equal(t, 224.0, testutil.ToFloat64(h.f.m.sent))
	require.Equal(t, 2.0, testutil.ToFloat64(h.sender.m.version))
	for _, r := range []string{FallbackUnsupported, FallbackMissingHeaders, FallbackBadRequest} {
		require.Zero(t, testutil.ToFloat64(h.sender.m.fallbacks.WithLabelValues(r)), r)
	}
}

// fallbackCase runs one collection against recv and requires that all 224
// fixture samples arrive, in 1.0 after the first attempt.
func fallbackCase(t *testing.T, recv *fakeReceiver, stateFile string) *harness {
	t.Helper()
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	h := newHarnessWith(t, prom.URL, recv, t.TempDir(), Options{MaxSamplesPerRequest: 100}, FederateOptions{},
		HTTPSenderOptions{StateFile: stateFile}, nil)
	require.NoError(t, h.f.Collect(context.Background()))
	h.deliverAll(t)
	require.Equal(t, 224.0, testutil.ToFloat64(h.f.m.sent), "no data lost")
	require.Equal(t, 1.0, testutil.ToFloat64(h.sender.m.version))
	for _, r := range []string{ReasonHTTP4xx, ReasonInvalid, ReasonPartialWrite} {
		require.Zero(t, testutil.ToFloat64(h.f.m.dropped.WithLabelValues(r)), r)
	}
	return h
}

func TestRemoteWrite2FallbackOn415Remembered(t *testing.T) {
	state := filepath.Join(t.TempDir(), "rw.json")
	recv := newFakeReceiver(t)
	recv.only1 = true
	h := fallbackCase(t, recv, state)
	require.Len(t, recv.series(), 224)
	require.Equal(t, []string{ProtoV1, ProtoV1, ProtoV1}, recv.protos, "the refused batch is re-sent in 1.0")
	require.Len(t, recv.headers, 4, "one 2.0 attempt, then 1.0 only")
	require.Equal(t, 1.0, testutil.ToFloat64(h.sender.m.fallbacks.WithLabelValues(FallbackUnsupported)))

	b, err := os.ReadFile(state)
	require.NoError(t, err)
	require.Contains(t, string(b), `"reason":"unsupported_media_type"`)

	// A restarted sender remembers the fallback and does not probe again ...
	s := NewHTTPSender(mustURL(t, recv.srv.URL), http.DefaultClient, HTTPSenderOptions{StateFile: state})
	require.NoError(t, s.Send(context.Background(), &prompb.WriteRequest{Timeseries: recv.series()[:1]}))
	require.Len(t, recv.headers, 5)
	require.Equal(t, ProtoV1, recv.headers[4].Get("X-Prometheus-Remote-Write-Version"))

	// ... until ReprobeAfter has passed; another endpoint is probed at once.
	later := NewHTTPSender(mustURL(t, recv.srv.URL), http.DefaultClient, HTTPSenderOptions{StateFile: state,
		ReprobeAfter: time.Hour, now: func() time.Time { return time.Now().Add(2 * time.Hour) }})
	require.Equal(t, ProtoV2, later.current())
	other := NewHTTPSender(mustURL(t, "http://127.0.0.1:1/other"), http.DefaultClient, HTTPSenderOptions{StateFile: state})
	require.Equal(t, ProtoV2, other.current())
	explicit := NewHTTPSender(mustURL(t, recv.srv.URL), http.DefaultClient, HTTPSenderOptions{StateFile: state, Version: VersionV2})
	require.Equal(t, ProtoV2, explicit.current())
}

func TestRemoteWrite2MissingHeadersMeans1Receiver(t *testing.T) {
	recv := newFakeReceiver(t)
	recv.noHeaders = true
	h := fallbackCase(t, recv, "")
	require.Equal(t, []string{ProtoV2, ProtoV1, ProtoV1, ProtoV1}, recv.protos, "the 2.0 batch is re-sent in 1.0")
	require.Equal(t, 1.0, testutil.ToFloat64(h.sender.m.fallbacks.WithLabelValues(FallbackMissingHeaders)))
}

func TestRemoteWrite2BadRequestBeforeConfirmed(t *testing.T) {
	recv := newFakeReceiver(t)
	recv.badRequest, recv.noHeaders = true, true // Prometheus 2.42
	h := fallbackCase(t, recv, "")
	require.Equal(t, []string{ProtoV1, ProtoV1, ProtoV1}, recv.protos)
	require.Equal(t, 1.0, testutil.ToFloat64(h.sender.m.fallbacks.WithLabelValues(FallbackBadRequest)))
}

func TestRemoteWrite2ExplicitVersions(t *testing.T) {
	t.Run("1", func(t *testing.T) {
		recv := newFakeReceiver(t)
		prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
		h := newHarnessWith(t, prom.URL, recv, t.TempDir(), Options{}, FederateOptions{}, HTTPSenderOptions{Version: VersionV1}, nil)
		require.NoError(t, h.f.Collect(context.Background()))
		h.deliverAll(t)
		require.Equal(t, []string{ProtoV1}, recv.protos)
		require.Equal(t, "application/x-protobuf", recv.headers[0].Get("Content-Type"))
		require.Len(t, recv.series(), 224)
	})
	t.Run("2 does not fall back", func(t *testing.T) {
		recv := newFakeReceiver(t)
		recv.only1 = true
		prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
		h := newHarnessWith(t, prom.URL, recv, t.TempDir(), Options{}, FederateOptions{}, HTTPSenderOptions{Version: VersionV2}, nil)
		require.NoError(t, h.f.Collect(context.Background()))
		h.deliverAll(t)
		require.Empty(t, recv.series())
		require.Equal(t, 224.0, testutil.ToFloat64(h.f.m.dropped.WithLabelValues(ReasonHTTP4xx)))
	})
}

func TestRemoteWrite2PartialWriteCounted(t *testing.T) {
	recv := newFakeReceiver(t)
	recv.underCount = 2
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{MaxSamplesPerRequest: 100}, FederateOptions{})
	require.NoError(t, h.f.Collect(context.Background()))
	h.deliverAll(t)
	require.Equal(t, 6.0, testutil.ToFloat64(h.f.m.dropped.WithLabelValues(ReasonPartialWrite)), "2 in each of 3 requests")
	require.Equal(t, 218.0, testutil.ToFloat64(h.f.m.sent))
	require.Len(t, recv.reqs, 3, "a partial write is not retried")
}

// A queue written before 2.0 support (1.0 payloads) is delivered, in 2.0.
func TestRemoteWrite2OldQueueRecords(t *testing.T) {
	dir := t.TempDir()
	q := openTestQueue(t, dir, QueueOptions{})
	req := &prompb.WriteRequest{
		Timeseries: []prompb.TimeSeries{{Labels: []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "job", Value: "a"}}, Samples: []prompb.Sample{{Value: 1, Timestamp: 1000}}}},
		Metadata:   []prompb.MetricMetadata{{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: "up", Help: "Up."}},
	}
	body, err := EncodeWriteRequest(req)
	require.NoError(t, err)
	require.NoError(t, q.Append(encodePayload(1, body)))
	recv := newFakeReceiver(t)
	f := New(discardLogger(), nil, nil, Policy{}, q, NewHTTPSender(mustURL(t, recv.srv.URL), http.DefaultClient, HTTPSenderOptions{}), Options{})
	draining := make(chan struct{})
	close(draining)
	f.sendLoop(context.Background(), draining)
	require.Equal(t, []string{ProtoV2}, recv.protos)
	require.Equal(t, 1.0, testutil.ToFloat64(f.m.sent))
	md, err := recv.v2[0].Timeseries[0].ToMetadata(recv.v2[0].Symbols)
	require.NoError(t, err)
	require.Equal(t, metadata.Metadata{Type: model.MetricTypeGauge, Help: "Up."}, md)
}

// metadataExposition serves, as delimited protobuf at /federate, a native
// histogram and a gauge with HELP and UNIT, as client_golang exposes them.
func metadataExposition(t *testing.T) *httptest.Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rpc_latency_seconds", Help: "RPC latency.", NativeHistogramBucketFactor: 1.1})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "build_info", Help: "Build information.", ConstLabels: prometheus.Labels{"version": "1.2.3"}})
	reg.MustRegister(hist, g)
	for i := 1; i <= 100; i++ {
		hist.Observe(float64(i) / 100)
	}
	g.Set(1)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "rpc_latency_seconds" {
			mf.Unit = proto.String("seconds")
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		format := expfmt.NegotiateAccept(r.Header, expfmt.DefaultAcceptedFormats()...)
		if format.FormatType() != expfmt.TypeProtoDelim {
			http.Error(w, "want protobuf", http.StatusNotAcceptable)
			return
		}
		w.Header().Set("Content-Type", string(format))
		enc := expfmt.NewEncoder(w, format)
		for _, mf := range mfs {
			_ = enc.Encode(mf)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func metadataPolicy(t *testing.T) *Policy {
	t.Helper()
	al, err := allowlist.Parse([]string{`{__name__=~"rpc_.*|build_info|http_requests_total"}`})
	require.NoError(t, err)
	rules, err := relabel.Parse(relabel.Config{ID: fixtureID, Salt: []byte(fixtureSalt)})
	require.NoError(t, err)
	return &Policy{Allow: al, Rules: rules}
}

func TestRemoteWrite2MetadataAndNativeHistograms(t *testing.T) {
	wantMeta := map[string]metadata.Metadata{
		"rpc_latency_seconds": {Type: model.MetricTypeHistogram, Help: "RPC latency.", Unit: "seconds"},
		"build_info":          {Type: model.MetricTypeGauge, Help: "Build information."},
	}
	t.Run("2.0 per series", func(t *testing.T) {
		recv := newFakeReceiver(t)
		h := newHarnessWith(t, metadataExposition(t).URL, recv, t.TempDir(), Options{}, FederateOptions{}, HTTPSenderOptions{}, metadataPolicy(t))
		require.NoError(t, h.f.Collect(context.Background()))
		h.deliverAll(t)
		require.Len(t, recv.v2, 1)
		r := recv.v2[0]
		require.Len(t, r.Timeseries, 2)
		b := labels.NewScratchBuilder(8)
		for _, ts := range r.Timeseries {
			ls, err := ts.ToLabels(&b, r.Symbols)
			require.NoError(t, err)
			require.Equal(t, hashedID, ls.Get("_id"))
			name := ls.Get(model.MetricNameLabel)
			md, err := ts.ToMetadata(r.Symbols)
			require.NoError(t, err)
			require.Equal(t, wantMeta[name], md, name)
			if name == "rpc_latency_seconds" {
				require.Empty(t, ts.Samples)
				require.Len(t, ts.Histograms, 1)
				hist := ts.Histograms[0].ToIntHistogram()
				require.Equal(t, uint64(100), hist.Count)
				require.InDelta(t, 50.5, hist.Sum, 1e-9)
				require.Equal(t, int32(3), hist.Schema)
			} else {
				require.Len(t, ts.Samples, 1)
			}
		}
		require.Equal(t, 2.0, testutil.ToFloat64(h.f.m.sent))
	})
	t.Run("1.0 per family", func(t *testing.T) {
		recv := newFakeReceiver(t)
		h := newHarnessWith(t, metadataExposition(t).URL, recv, t.TempDir(), Options{}, FederateOptions{}, HTTPSenderOptions{Version: VersionV1}, metadataPolicy(t))
		require.NoError(t, h.f.Collect(context.Background()))
		h.deliverAll(t)
		require.Len(t, recv.reqs, 1)
		req := recv.reqs[0]
		require.ElementsMatch(t, []prompb.MetricMetadata{
			{Type: prompb.MetricMetadata_HISTOGRAM, MetricFamilyName: "rpc_latency_seconds", Help: "RPC latency.", Unit: "seconds"},
			{Type: prompb.MetricMetadata_GAUGE, MetricFamilyName: "build_info", Help: "Build information."},
		}, req.Metadata)
		var hists int
		for _, ts := range req.Timeseries {
			for _, hp := range ts.Histograms {
				hists++
				require.Equal(t, uint64(100), hp.ToIntHistogram().Count)
			}
		}
		require.Equal(t, 1, hists)
	})
	t.Run("text format", func(t *testing.T) {
		text := strings.Join([]string{
			"# HELP http_requests_total Requests served.",
			"# TYPE http_requests_total counter",
			`http_requests_total{code="200"} 5 1767268800000`,
			"# HELP rpc_duration_seconds Durations.",
			"# TYPE rpc_duration_seconds histogram",
			`rpc_duration_seconds_bucket{le="1"} 1 1767268800000`,
			`rpc_duration_seconds_bucket{le="+Inf"} 1 1767268800000`,
			"rpc_duration_seconds_sum 0.5 1767268800000",
			"rpc_duration_seconds_count 1 1767268800000",
			"rpc_other 3 1767268800000", // no metadata of its own
		}, "\n") + "\n"
		recv := newFakeReceiver(t)
		h := newHarnessWith(t, fakePrometheus(t, []byte(text), false).URL, recv, t.TempDir(), Options{}, FederateOptions{},
			HTTPSenderOptions{Version: VersionV1}, metadataPolicy(t))
		require.NoError(t, h.f.Collect(context.Background()))
		h.deliverAll(t)
		require.Len(t, recv.series(), 6)
		require.ElementsMatch(t, []prompb.MetricMetadata{
			{Type: prompb.MetricMetadata_COUNTER, MetricFamilyName: "http_requests_total", Help: "Requests served."},
			{Type: prompb.MetricMetadata_HISTOGRAM, MetricFamilyName: "rpc_duration_seconds", Help: "Durations."},
		}, recv.reqs[0].Metadata)
	})
}

// The 1.0 and 2.0 forms convert into each other without loss.
func TestRecordConversionRoundTrip(t *testing.T) {
	hist := prompb.FromIntHistogram(2000, testHistogram())
	v1 := &prompb.WriteRequest{
		Timeseries: []prompb.TimeSeries{
			{Labels: []prompb.Label{{Name: "__name__", Value: "a_total"}, {Name: "x", Value: "1"}}, Samples: []prompb.Sample{{Value: 1, Timestamp: 1000}, {Value: 2, Timestamp: 2000}}},
			{Labels: []prompb.Label{{Name: "__name__", Value: "h"}}, Histograms: []prompb.Histogram{hist}},
		},
		Metadata: []prompb.MetricMetadata{
			{Type: prompb.MetricMetadata_COUNTER, MetricFamilyName: "a", Help: "A.", Unit: "bytes"},
			{Type: prompb.MetricMetadata_HISTOGRAM, MetricFamilyName: "h", Help: "H."},
		},
	}
	v2 := V1ToV2(v1)
	require.Equal(t, "", v2.Symbols[0])
	back, err := V2ToV1(v2)
	require.NoError(t, err)
	sameSeries(t, v1.Timeseries, back.Timeseries)
	// a_total's family is looked up as "a"; going back it is named after the series.
	require.ElementsMatch(t, []prompb.MetricMetadata{
		{Type: prompb.MetricMetadata_COUNTER, MetricFamilyName: "a_total", Help: "A.", Unit: "bytes"},
		{Type: prompb.MetricMetadata_HISTOGRAM, MetricFamilyName: "h", Help: "H."},
	}, back.Metadata)

	body, err := EncodeWriteRequestV2(v2)
	require.NoError(t, err)
	rec, err := decodePayload(encodePayloadV2(3, body))
	require.NoError(t, err)
	require.Equal(t, Record{Proto: ProtoV2, Body: body, Samples: 3}, rec)
	got, err := rec.toV1()
	require.NoError(t, err)
	sameSeries(t, v1.Timeseries, got.Timeseries)

	_, err = decodePayload([]byte{0x00, 0x09, 0x01})
	require.ErrorIs(t, err, errInvalidPayload)
}

func testHistogram() *histogram.Histogram {
	return &histogram.Histogram{
		Schema: 1, Count: 5, Sum: 12.5, ZeroThreshold: 0.001, ZeroCount: 1,
		PositiveSpans: []histogram.Span{{Offset: 0, Length: 2}}, PositiveBuckets: []int64{2, 0},
	}
}

// sameSeries compares on the wire (nil and empty slices are the same there).
func sameSeries(t *testing.T, want, got []prompb.TimeSeries) {
	t.Helper()
	w, err := (&prompb.WriteRequest{Timeseries: want}).Marshal()
	require.NoError(t, err)
	g, err := (&prompb.WriteRequest{Timeseries: got}).Marshal()
	require.NoError(t, err)
	require.Equal(t, w, g)
}

// TestNoHelpTextWithAnonymizedLabels: a family's help text may quote a
// value that a series of the family carries hashed, and the forwarder
// cannot know which values a family's later series (or another family's)
// will carry when it sends the first: with anonymized labels configured,
// no help text is sent, for any series. Without them, help is sent (the
// raw id scrubbed).
func TestNoHelpTextWithAnonymizedLabels(t *testing.T) {
	text := strings.Join([]string{
		"# HELP kube_pod_info Pods of customer-acme-prod and others.",
		"# TYPE kube_pod_info gauge",
		`kube_pod_info{node="n1"} 1 1767268800000`, // before the series that holds the value
		`kube_pod_info{namespace="customer-acme-prod"} 1 1767268800000`,
		"# HELP http_requests_total Requests served.",
		"# TYPE http_requests_total counter",
		`http_requests_total{code="200"} 5 1767268800000`,
	}, "\n") + "\n"
	al, err := allowlist.Parse([]string{`{__name__=~"kube_pod_info|http_requests_total"}`})
	require.NoError(t, err)
	for _, tc := range []struct {
		name      string
		anonymize []string
		help      map[string]string
	}{
		{"anonymized labels", []string{"namespace"}, map[string]string{"kube_pod_info": "", "http_requests_total": ""}},
		{"none", nil, map[string]string{"kube_pod_info": "Pods of customer-acme-prod and others.", "http_requests_total": "Requests served."}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := relabel.Parse(relabel.Config{ID: fixtureID, Salt: []byte(fixtureSalt), AnonymizeLabels: tc.anonymize})
			require.NoError(t, err)
			recv := newFakeReceiver(t)
			h := newHarnessWith(t, fakePrometheus(t, []byte(text), false).URL, recv, t.TempDir(), Options{}, FederateOptions{},
				HTTPSenderOptions{}, &Policy{Allow: al, Rules: rules})
			require.NoError(t, h.f.Collect(context.Background()))
			h.deliverAll(t)
			require.Len(t, recv.v2, 1)
			r := recv.v2[0]
			if tc.anonymize != nil {
				require.NotContains(t, strings.Join(r.Symbols, "\n"), "customer-acme-prod")
			}
			b := labels.NewScratchBuilder(8)
			require.Len(t, r.Timeseries, 3)
			for _, ts := range r.Timeseries {
				ls, err := ts.ToLabels(&b, r.Symbols)
				require.NoError(t, err)
				md, err := ts.ToMetadata(r.Symbols)
				require.NoError(t, err)
				name := ls.Get(model.MetricNameLabel)
				typ := model.MetricTypeGauge
				if name == "http_requests_total" {
					typ = model.MetricTypeCounter
				}
				require.Equal(t, metadata.Metadata{Type: typ, Help: tc.help[name]}, md, ls.String())
			}
		})
	}
}
