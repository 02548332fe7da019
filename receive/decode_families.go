package receive

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
)

// Metric types of io.prometheus.client.MetricFamily (client_model's MetricType).
const (
	familyCounter        = 0
	familyGauge          = 1
	familySummary        = 2
	familyUntyped        = 3
	familyHistogram      = 4
	familyGaugeHistogram = 5
)

// familyRequest is a telemeter-client upload decoded into the series
// Prometheus would store when scraping the same families: counters, gauges
// and untyped metrics give one series; summaries give one per quantile plus
// _sum and _count; classic histograms give one _bucket series per bucket
// (+Inf added when missing) plus _sum and _count. Native histogram buckets
// are not converted (telemeter-client federates, and federation sends
// classic series); such a histogram keeps its _sum and _count.
//
// Storage is reused from one request to the next, as in v1Request. Label
// names and values alias the decoded body, except the derived ones (the
// _sum/_count/_bucket names, le and quantile values), which are allocated.
type familyRequest struct {
	series  []prompb.TimeSeries
	labels  []prompb.Label
	samples []prompb.Sample
	spans   []seriesSpan
	meta    []prompb.MetricMetadata
	pairs   []prompb.Label // the label pairs of the metric being converted
}

// errFamilyExpands refuses an upload that would expand into far more labels
// than it has bytes (a histogram of many buckets on a series of many labels).
var errFamilyExpands = errors.New("upload expands into too many labels")

func (d *familyRequest) reset() {
	clear(d.series) // drop references into the previous body
	clear(d.labels)
	clear(d.meta)
	clear(d.pairs)
	d.series, d.labels, d.samples, d.spans, d.meta, d.pairs = d.series[:0], d.labels[:0], d.samples[:0], d.spans[:0], d.meta[:0], d.pairs[:0]
}

func (d *familyRequest) poolable() bool {
	return cap(d.series) <= maxPooledSeries && cap(d.spans) <= maxPooledSeries && cap(d.meta) <= maxPooledSeries &&
		cap(d.labels) <= maxPooledLabels && cap(d.samples) <= maxPooledLabels && cap(d.pairs) <= maxPooledLabels
}

// decodeFamilies decodes raw, a sequence of varint-length-delimited
// MetricFamily messages, into d. Samples without a timestamp get now (ms).
// Malformed input is errBadRequest; an upload that would expand beyond
// about four labels per byte is errTooLarge.
func decodeFamilies(raw []byte, d *familyRequest, now int64) error {
	d.reset()
	if err := d.decode(raw, now); err != nil {
		d.reset()
		if errors.Is(err, errFamilyExpands) {
			return fmt.Errorf("metric families: %w: %w", errTooLarge, err)
		}
		return fmt.Errorf("metric families: %w: %w", errBadRequest, err)
	}
	for i := range d.series {
		sp := d.spans[i]
		// Full slice expressions, as in v1Request: an _id added to one
		// series must not overwrite the next one's labels.
		d.series[i].Labels = d.labels[sp.labels[0]:sp.labels[1]:sp.labels[1]]
		d.series[i].Samples = d.samples[sp.samples[0]:sp.samples[1]:sp.samples[1]]
	}
	return nil
}

func (d *familyRequest) decode(raw []byte, now int64) error {
	maxLabels := 4*len(raw) + 1024
	p := pbReader{b: raw}
	for n := 0; !p.done(); n++ {
		msg, err := p.bytes() // the varint length prefix, then the message
		if err != nil {
			return fmt.Errorf("family %d: length-delimited message: %w", n, err)
		}
		if err := d.decodeFamily(msg, now); err != nil {
			return fmt.Errorf("family %d: %w", n, err)
		}
		if len(d.labels) > maxLabels {
			return errFamilyExpands
		}
	}
	return nil
}

// family is what decodeFamily needs of a MetricFamily before its metrics.
type family struct {
	name, help, unit string
	typ              uint64
}

// decodeFamily reads the family's name and type first (a message may carry
// its fields in any order), then converts its metrics.
func (d *familyRequest) decodeFamily(raw []byte, now int64) error {
	var f family
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return err
		}
		switch field {
		case 1, 2, 5: // name, help, unit
			b, err := p.message(wire, "MetricFamily string")
			if err != nil {
				return err
			}
			s := aliasString(b)
			switch field {
			case 1:
				f.name = s
			case 2:
				f.help = s
			default:
				f.unit = s
			}
		case 3: // type
			if wire != 0 {
				return fmt.Errorf("proto: wrong wireType = %d for field Type", wire)
			}
			if f.typ, err = p.varint(); err != nil {
				return err
			}
		default:
			if err := p.skip(wire); err != nil {
				return err
			}
		}
	}
	if f.name == "" {
		return errors.New("metric family without a name")
	}
	d.addMetadata(f)
	p = pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return err
		}
		if field != 4 {
			if err := p.skip(wire); err != nil {
				return err
			}
			continue
		}
		msg, err := p.message(wire, "Metric")
		if err != nil {
			return err
		}
		if err := d.decodeMetric(f, msg, now); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}

// addMetadata keeps a family's type, help and unit as remote-write 1.0
// metadata; storage keeps these strings, so they are copies. Untyped
// families without help (what federation sends) have nothing to keep.
func (d *familyRequest) addMetadata(f family) {
	typ := prompb.MetricMetadata_UNKNOWN
	switch f.typ {
	case familyCounter:
		typ = prompb.MetricMetadata_COUNTER
	case familyGauge:
		typ = prompb.MetricMetadata_GAUGE
	case familySummary:
		typ = prompb.MetricMetadata_SUMMARY
	case familyHistogram:
		typ = prompb.MetricMetadata_HISTOGRAM
	case familyGaugeHistogram:
		typ = prompb.MetricMetadata_GAUGEHISTOGRAM
	}
	if typ == prompb.MetricMetadata_UNKNOWN && f.help == "" && f.unit == "" {
		return
	}
	d.meta = append(d.meta, prompb.MetricMetadata{
		Type: typ, MetricFamilyName: strings.Clone(f.name), Help: strings.Clone(f.help), Unit: strings.Clone(f.unit),
	})
}

// metric is one decoded Metric (its label pairs are in d.pairs): the value
// fields this converter uses.
type metric struct {
	value      float64 // gauge, counter or untyped
	hasTS      bool
	ts         int64
	summary    []byte
	histogram  []byte
	valueField int32 // which of gauge (2), counter (3), untyped (5) was set last
}

func (d *familyRequest) decodeMetric(f family, raw []byte, now int64) error {
	var m metric
	clear(d.pairs)
	d.pairs = d.pairs[:0]
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return err
		}
		switch field {
		case 1: // label
			msg, err := p.message(wire, "Label")
			if err != nil {
				return err
			}
			l, err := decodeLabel(msg)
			if err != nil {
				return err
			}
			d.pairs = append(d.pairs, l)
		case 2, 3, 5: // gauge, counter, untyped: field 1 is the value
			msg, err := p.message(wire, "Value")
			if err != nil {
				return err
			}
			if m.value, err = decodeDouble(msg, 1); err != nil {
				return err
			}
			m.valueField = field
		case 4:
			if m.summary, err = p.message(wire, "Summary"); err != nil {
				return err
			}
		case 7:
			if m.histogram, err = p.message(wire, "Histogram"); err != nil {
				return err
			}
		case 6: // timestamp_ms
			if wire != 0 {
				return fmt.Errorf("proto: wrong wireType = %d for field TimestampMs", wire)
			}
			v, err := p.varint()
			if err != nil {
				return err
			}
			m.ts, m.hasTS = int64(v), true
		default:
			if err := p.skip(wire); err != nil {
				return err
			}
		}
	}
	if !m.hasTS {
		m.ts = now
	}
	switch f.typ {
	case familySummary:
		return d.convertSummary(f.name, &m)
	case familyHistogram, familyGaugeHistogram:
		return d.convertHistogram(f.name, &m)
	default: // counter, gauge, untyped and unknown types: the value as it is
		d.emit(f.name, &m, "", "", m.value)
		return nil
	}
}

func (d *familyRequest) convertSummary(name string, m *metric) error {
	var count uint64
	var sum float64
	p := pbReader{b: m.summary}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return err
		}
		switch field {
		case 1:
			if count, err = readUvarint(&p, wire, "SampleCount"); err != nil {
				return err
			}
		case 2:
			if sum, err = readDouble(&p, wire, "SampleSum"); err != nil {
				return err
			}
		case 3:
			msg, err := p.message(wire, "Quantile")
			if err != nil {
				return err
			}
			q, err := decodeDouble(msg, 1)
			if err != nil {
				return err
			}
			v, err := decodeDouble(msg, 2)
			if err != nil {
				return err
			}
			d.emit(name, m, model.QuantileLabel, formatFloat(q), v)
		default:
			if err := p.skip(wire); err != nil {
				return err
			}
		}
	}
	d.emit(name+"_sum", m, "", "", sum)
	d.emit(name+"_count", m, "", "", float64(count))
	return nil
}

func (d *familyRequest) convertHistogram(name string, m *metric) error {
	var (
		count, countFloat float64
		sum               float64
		sawInf            bool
	)
	bucket := name + "_bucket"
	p := pbReader{b: m.histogram}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return err
		}
		switch field {
		case 1:
			c, err := readUvarint(&p, wire, "SampleCount")
			if err != nil {
				return err
			}
			count = float64(c)
		case 4:
			if countFloat, err = readDouble(&p, wire, "SampleCountFloat"); err != nil {
				return err
			}
		case 2:
			if sum, err = readDouble(&p, wire, "SampleSum"); err != nil {
				return err
			}
		case 3:
			msg, err := p.message(wire, "Bucket")
			if err != nil {
				return err
			}
			ub, v, err := decodeBucket(msg)
			if err != nil {
				return err
			}
			sawInf = sawInf || math.IsInf(ub, 1)
			d.emit(bucket, m, model.BucketLabel, formatFloat(ub), v)
		default: // native histogram fields, exemplars, created timestamp
			if err := p.skip(wire); err != nil {
				return err
			}
		}
	}
	if countFloat > 0 {
		count = countFloat
	}
	if !sawInf {
		d.emit(bucket, m, model.BucketLabel, "+Inf", count) // as Prometheus adds it when scraping
	}
	d.emit(name+"_sum", m, "", "", sum)
	d.emit(name+"_count", m, "", "", count)
	return nil
}

// decodeBucket returns a Bucket's upper bound and cumulative count (the
// float count when set).
func decodeBucket(raw []byte) (upper, count float64, err error) {
	var countFloat float64
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return 0, 0, err
		}
		switch field {
		case 1:
			c, err := readUvarint(&p, wire, "CumulativeCount")
			if err != nil {
				return 0, 0, err
			}
			count = float64(c)
		case 2:
			if upper, err = readDouble(&p, wire, "UpperBound"); err != nil {
				return 0, 0, err
			}
		case 4:
			if countFloat, err = readDouble(&p, wire, "CumulativeCountFloat"); err != nil {
				return 0, 0, err
			}
		default:
			if err := p.skip(wire); err != nil {
				return 0, 0, err
			}
		}
	}
	if countFloat > 0 {
		count = countFloat
	}
	return upper, count, nil
}

// emit appends one series: __name__=name, the metric's label pairs, and extraName=
// extraValue when set, sorted by name, with one sample.
func (d *familyRequest) emit(name string, m *metric, extraName, extraValue string, v float64) {
	start := len(d.labels)
	d.labels = append(d.labels, prompb.Label{Name: model.MetricNameLabel, Value: name})
	d.labels = append(d.labels, d.pairs...)
	if extraName != "" {
		d.labels = append(d.labels, prompb.Label{Name: extraName, Value: extraValue})
	}
	sortLabels(d.labels[start:])
	d.samples = append(d.samples, prompb.Sample{Value: v, Timestamp: m.ts})
	d.series = append(d.series, prompb.TimeSeries{})
	d.spans = append(d.spans, seriesSpan{
		labels:  [2]int32{int32(start), int32(len(d.labels))},
		samples: [2]int32{int32(len(d.samples) - 1), int32(len(d.samples))},
	})
}

// sortLabels sorts ls by name with an insertion sort: a metric's pairs come
// sorted from any exposition encoder, so only __name__ moves.
func sortLabels(ls []prompb.Label) {
	for i := 1; i < len(ls); i++ {
		for j := i; j > 0 && ls[j].Name < ls[j-1].Name; j-- {
			ls[j], ls[j-1] = ls[j-1], ls[j]
		}
	}
}

// formatFloat formats a bucket bound or quantile as Prometheus' exposition
// formats do.
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	case math.IsNaN(f):
		return "NaN"
	default:
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
}

// decodeDouble returns the double field of raw, a small message (Gauge,
// Counter, Untyped, Quantile), or 0 when it is absent.
func decodeDouble(raw []byte, want int32) (float64, error) {
	var v float64
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return 0, err
		}
		if field != want {
			if err := p.skip(wire); err != nil {
				return 0, err
			}
			continue
		}
		if v, err = readDouble(&p, wire, "Value"); err != nil {
			return 0, err
		}
	}
	return v, nil
}

func readDouble(p *pbReader, wire int, name string) (float64, error) {
	if wire != 1 {
		return 0, fmt.Errorf("proto: wrong wireType = %d for field %s", wire, name)
	}
	v, err := p.fixed64()
	return math.Float64frombits(v), err
}

func readUvarint(p *pbReader, wire int, name string) (uint64, error) {
	if wire != 0 {
		return 0, fmt.Errorf("proto: wrong wireType = %d for field %s", wire, name)
	}
	return p.varint()
}
