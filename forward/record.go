package forward

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/golang/snappy"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// Remote-write protocol versions, as sent in X-Prometheus-Remote-Write-Version.
const (
	ProtoV1 = "0.1.0"
	ProtoV2 = "2.0.0"
)

// Content types of the two protocol versions.
const (
	contentTypeV1 = "application/x-protobuf"
	contentTypeV2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
)

// Record is one queued request, in the form the queue stores it. The queue
// keeps the remote-write 2.0 form (smaller, and it carries per-series
// metadata); records written by forwarders before 2.0 support hold the 1.0
// form. Either is re-encoded into the other when the endpoint needs it, so a
// protocol fallback never loses data.
//
// On disk a payload is either
//
//	uvarint(n) snappy(prometheus.WriteRequest)                  n > 0: 1.0 (before 2.0 support)
//	0x00 0x02 uvarint(n) snappy(io.prometheus.write.v2.Request) 2.0
//
// where n counts the samples plus histograms of the request. A 1.0 payload
// never starts with 0x00, as it was never written for an empty request.
type Record struct {
	Proto string // ProtoV1 or ProtoV2: the form of Body
	// Body is the snappy-compressed protobuf, exactly a remote-write body of Proto.
	Body []byte
	// Samples counts the samples and histograms in Body.
	Samples int
}

const payloadV2Tag = 0x02

// encodePayload encodes a queue payload holding a 2.0 body.
func encodePayloadV2(samples int, body []byte) []byte {
	out := make([]byte, 0, 2+binary.MaxVarintLen32+len(body))
	out = append(out, 0x00, payloadV2Tag)
	out = binary.AppendUvarint(out, uint64(samples))
	return append(out, body...)
}

// encodePayload encodes a queue payload holding a 1.0 body, the format of
// forwarders before 2.0 support (kept for tests of old queues).
func encodePayload(samples int, body []byte) []byte {
	out := binary.AppendUvarint(make([]byte, 0, len(body)+binary.MaxVarintLen32), uint64(samples))
	return append(out, body...)
}

var errInvalidPayload = errors.New("invalid queue payload")

// decodePayload decodes a queue payload of either form. Body aliases p.
func decodePayload(p []byte) (Record, error) {
	proto := ProtoV1
	if len(p) > 0 && p[0] == 0x00 {
		if len(p) < 2 || p[1] != payloadV2Tag {
			return Record{}, fmt.Errorf("%w: unknown format", errInvalidPayload)
		}
		proto, p = ProtoV2, p[2:]
	}
	n, k := binary.Uvarint(p)
	if k <= 0 || n > 1<<31 {
		return Record{}, fmt.Errorf("%w: bad header", errInvalidPayload)
	}
	return Record{Proto: proto, Body: p[k:], Samples: int(n)}, nil
}

// EncodeWriteRequest marshals and snappy-compresses req, as remote-write 1.0 sends it.
func EncodeWriteRequest(req *prompb.WriteRequest) ([]byte, error) {
	raw, err := req.Marshal()
	if err != nil {
		return nil, fmt.Errorf("marshal write request: %w", err)
	}
	return snappy.Encode(nil, raw), nil
}

// EncodeWriteRequestV2 marshals and snappy-compresses req, as remote-write 2.0 sends it.
func EncodeWriteRequestV2(req *writev2.Request) ([]byte, error) {
	raw, err := req.OptimizedMarshal(nil)
	if err != nil {
		return nil, fmt.Errorf("marshal write request: %w", err)
	}
	return snappy.Encode(nil, raw), nil
}

// as returns r's body encoded for proto, converting if needed.
func (r Record) as(proto string) ([]byte, error) {
	if r.Proto == proto {
		return r.Body, nil
	}
	raw, err := snappy.Decode(nil, r.Body)
	if err != nil {
		return nil, fmt.Errorf("decode queued request: %w", err)
	}
	switch proto {
	case ProtoV1:
		var req writev2.Request
		if err := req.Unmarshal(raw); err != nil {
			return nil, fmt.Errorf("decode queued request: %w", err)
		}
		v1, err := V2ToV1(&req)
		if err != nil {
			return nil, err
		}
		return EncodeWriteRequest(v1)
	default:
		var req prompb.WriteRequest
		if err := req.Unmarshal(raw); err != nil {
			return nil, fmt.Errorf("decode queued request: %w", err)
		}
		return EncodeWriteRequestV2(V1ToV2(&req))
	}
}

// toV1 decodes r into a 1.0 request (for senders that only take those).
func (r Record) toV1() (*prompb.WriteRequest, error) {
	body, err := r.as(ProtoV1)
	if err != nil {
		return nil, err
	}
	raw, err := snappy.Decode(nil, body)
	if err != nil {
		return nil, fmt.Errorf("decode queued request: %w", err)
	}
	var req prompb.WriteRequest
	if err := req.Unmarshal(raw); err != nil {
		return nil, fmt.Errorf("decode queued request: %w", err)
	}
	return &req, nil
}

// V2ToV1 converts a 2.0 request into the equivalent 1.0 one: labels resolved,
// samples, histograms and exemplars copied one for one, and the per-series
// metadata turned into one WriteRequest.metadata entry per family (the
// series name without _bucket/_sum/_count for histograms and summaries).
// The result references req's strings.
func V2ToV1(req *writev2.Request) (*prompb.WriteRequest, error) {
	out := &prompb.WriteRequest{Timeseries: make([]prompb.TimeSeries, 0, len(req.Timeseries))}
	syms := req.Symbols
	b := labels.NewScratchBuilder(16)
	type metaKey struct {
		t                prompb.MetricMetadata_MetricType
		name, help, unit string
	}
	seen := map[metaKey]bool{}
	for i := range req.Timeseries {
		ts := &req.Timeseries[i]
		ls, err := ts.ToLabels(&b, syms)
		if err != nil {
			return nil, fmt.Errorf("series %d: %w", i, err)
		}
		o := prompb.TimeSeries{Labels: prompb.FromLabels(ls, nil)}
		if len(ts.Samples) > 0 {
			o.Samples = make([]prompb.Sample, len(ts.Samples))
			for j, s := range ts.Samples {
				o.Samples[j] = prompb.Sample{Value: s.Value, Timestamp: s.Timestamp}
			}
		}
		for _, h := range ts.Histograms {
			if h.IsFloatHistogram() {
				o.Histograms = append(o.Histograms, prompb.FromFloatHistogram(h.Timestamp, h.ToFloatHistogram()))
			} else {
				o.Histograms = append(o.Histograms, prompb.FromIntHistogram(h.Timestamp, h.ToIntHistogram()))
			}
		}
		for _, e := range ts.Exemplars {
			ex, err := e.ToExemplar(&b, syms)
			if err != nil {
				return nil, fmt.Errorf("series %d: %w", i, err)
			}
			o.Exemplars = append(o.Exemplars, prompb.Exemplar{Labels: prompb.FromLabels(ex.Labels, nil), Value: ex.Value, Timestamp: ex.Ts})
		}
		out.Timeseries = append(out.Timeseries, o)

		md, err := ts.ToMetadata(syms)
		if err != nil {
			return nil, fmt.Errorf("series %d: %w", i, err)
		}
		if md.Type == model.MetricTypeUnknown && md.Help == "" && md.Unit == "" {
			continue
		}
		mm := prompb.MetricMetadata{
			Type:             prompb.FromMetadataType(md.Type),
			MetricFamilyName: familyName(ls.Get(model.MetricNameLabel), md.Type),
			Help:             md.Help,
			Unit:             md.Unit,
		}
		if k := (metaKey{mm.Type, mm.MetricFamilyName, mm.Help, mm.Unit}); !seen[k] {
			seen[k] = true
			out.Metadata = append(out.Metadata, mm)
		}
	}
	return out, nil
}

// familyName is the metric family of a series name: histograms and
// summaries drop their _bucket, _sum, _count (and _created) suffixes.
func familyName(name string, t model.MetricType) string {
	switch t {
	case model.MetricTypeHistogram, model.MetricTypeGaugeHistogram, model.MetricTypeSummary:
		for _, suf := range []string{"_bucket", "_sum", "_count", "_created", "_gsum", "_gcount"} {
			if s, ok := strings.CutSuffix(name, suf); ok {
				return s
			}
		}
	}
	return name
}

// V1ToV2 converts a 1.0 request into the equivalent 2.0 one. A series gets
// the metadata of the family named like it, or like it without a
// _bucket/_sum/_count/_total/_created/_info suffix.
func V1ToV2(req *prompb.WriteRequest) *writev2.Request {
	st := writev2.NewSymbolTable()
	meta := make(map[string]prompb.MetricMetadata, len(req.Metadata))
	for _, m := range req.Metadata {
		meta[m.MetricFamilyName] = m
	}
	out := &writev2.Request{Timeseries: make([]writev2.TimeSeries, 0, len(req.Timeseries))}
	for i := range req.Timeseries {
		ts := &req.Timeseries[i]
		o := writev2.TimeSeries{LabelsRefs: make([]uint32, 0, 2*len(ts.Labels))}
		name := ""
		for _, l := range ts.Labels {
			if l.Name == model.MetricNameLabel {
				name = l.Value
			}
			o.LabelsRefs = append(o.LabelsRefs, st.Symbolize(l.Name), st.Symbolize(l.Value))
		}
		if len(ts.Samples) > 0 {
			o.Samples = make([]writev2.Sample, len(ts.Samples))
			for j, s := range ts.Samples {
				o.Samples[j] = writev2.Sample{Value: s.Value, Timestamp: s.Timestamp}
			}
		}
		for _, h := range ts.Histograms {
			if h.IsFloatHistogram() {
				o.Histograms = append(o.Histograms, writev2.FromFloatHistogram(0, h.Timestamp, h.ToFloatHistogram()))
			} else {
				o.Histograms = append(o.Histograms, writev2.FromIntHistogram(0, h.Timestamp, h.ToIntHistogram()))
			}
		}
		for _, e := range ts.Exemplars {
			ex := writev2.Exemplar{Value: e.Value, Timestamp: e.Timestamp}
			for _, l := range e.Labels {
				ex.LabelsRefs = append(ex.LabelsRefs, st.Symbolize(l.Name), st.Symbolize(l.Value))
			}
			o.Exemplars = append(o.Exemplars, ex)
		}
		if m, ok := lookupFamily(meta, name); ok {
			o.Metadata = writev2.Metadata{
				Type:    writev2.FromMetadataType(metricTypeOf(m.Type)),
				HelpRef: st.Symbolize(m.Help),
				UnitRef: st.Symbolize(m.Unit),
			}
		}
		out.Timeseries = append(out.Timeseries, o)
	}
	out.Symbols = st.Symbols()
	return out
}

func lookupFamily(meta map[string]prompb.MetricMetadata, name string) (prompb.MetricMetadata, bool) {
	if len(meta) == 0 || name == "" {
		return prompb.MetricMetadata{}, false
	}
	if m, ok := meta[name]; ok {
		return m, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count", "_total", "_created", "_info"} {
		if s, ok := strings.CutSuffix(name, suf); ok {
			if m, ok := meta[s]; ok {
				return m, true
			}
		}
	}
	return prompb.MetricMetadata{}, false
}

func metricTypeOf(t prompb.MetricMetadata_MetricType) model.MetricType {
	switch t {
	case prompb.MetricMetadata_COUNTER:
		return model.MetricTypeCounter
	case prompb.MetricMetadata_GAUGE:
		return model.MetricTypeGauge
	case prompb.MetricMetadata_HISTOGRAM:
		return model.MetricTypeHistogram
	case prompb.MetricMetadata_GAUGEHISTOGRAM:
		return model.MetricTypeGaugeHistogram
	case prompb.MetricMetadata_SUMMARY:
		return model.MetricTypeSummary
	case prompb.MetricMetadata_INFO:
		return model.MetricTypeInfo
	case prompb.MetricMetadata_STATESET:
		return model.MetricTypeStateset
	default:
		return model.MetricTypeUnknown
	}
}
