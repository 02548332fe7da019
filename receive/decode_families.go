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

	// exp bounds what the series take while converting: one metric of
	// many pairs and many buckets copies its pairs into every bucket's
	// series, so the bound is checked on every series, not once per family.
	exp     expansion
	stopped error // why emit stopped adding series (exp, the burst, the in-flight bytes): decode refuses the upload with it
	// maxSamples, when set before decoding, refuses an upload of more
	// series than the limits admit at once (errTooLarge).
	maxSamples int
	// res, when set before decoding, reserves the memory decoding takes
	// (Options.MaxInflightBytes); nil reserves nothing.
	res *reservation

	// restamp stores every metric at the receive time, as telemeter-server
	// does (telemeter.go); drift counts the timestamps it replaced that were
	// more than driftRange off, by tense.
	restamp bool
	drift   [numTenses]int
}

// Tenses of a replaced upload timestamp against the receive time.
const (
	tensePast = iota
	tensePresent
	tenseFuture
	numTenses
)

// driftRange is how far from the receive time a replaced timestamp counts
// as present (telemeter-server's metricscollector_overwritten_timestamps_total
// uses the same range).
const driftRange = 5 * 60 * 1000 // ms

func tenseOf(ts, now int64) int {
	switch {
	case ts < now-driftRange:
		return tensePast
	case ts > now+driftRange:
		return tenseFuture
	}
	return tensePresent
}

func (d *familyRequest) reset() {
	clear(d.series) // drop references into the previous body
	clear(d.labels)
	clear(d.meta)
	clear(d.pairs)
	d.series, d.labels, d.samples, d.spans, d.meta, d.pairs = d.series[:0], d.labels[:0], d.samples[:0], d.spans[:0], d.meta[:0], d.pairs[:0]
	d.stopped = nil
	d.drift = [numTenses]int{}
}

func (d *familyRequest) poolable() bool {
	return cap(d.series) <= maxPooledSeries && cap(d.spans) <= maxPooledSeries && cap(d.meta) <= maxPooledSeries &&
		cap(d.labels) <= maxPooledLabels && cap(d.samples) <= maxPooledLabels && cap(d.pairs) <= maxPooledLabels
}

// decodeFamilies decodes raw, a sequence of varint-length-delimited
// MetricFamily messages, into d. Samples without a timestamp get now (ms),
// and with restamp every sample does. Malformed input is errBadRequest; an
// upload whose series would take more than expansionFactorFamilies times
// its size in memory, or more samples than maxSamples, is errTooLarge.
func decodeFamilies(raw []byte, d *familyRequest, now int64, restamp bool) error {
	d.reset()
	d.restamp = restamp
	if err := d.decode(raw, now); err != nil {
		d.reset()
		if limitErr(err) { // from emit: not malformed
			return fmt.Errorf("metric families: %w", err)
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
	d.exp = newExpansion(len(raw), expansionFactorFamilies, d.maxSamples, d.res)
	p := pbReader{b: raw}
	for n := 0; !p.done(); n++ {
		msg, err := p.bytes() // the varint length prefix, then the message
		if err != nil {
			return fmt.Errorf("family %d: length-delimited message: %w", n, err)
		}
		if err := d.decodeFamily(msg, now); err != nil {
			return fmt.Errorf("family %d: %w", n, err)
		}
		if d.stopped != nil {
			return d.stopped
		}
	}
	return nil
}

// family is what decodeFamily needs of a MetricFamily before its metrics.
type family struct {
	name, help, unit string
	typ              uint64
}

// Wire types of the protobuf encoding that these messages use.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
)

// eachField calls fn for every field of raw whose wire type is the one
// wireOf expects for it. Other fields are skipped: protobuf-go, which
// generates client_model, treats a known field with another wire type as
// an unknown one.
//
// fn makes p escape, so each call allocates it: the per-metric fields take
// nextField in a loop instead (a fifth of an upload's CPU went to these
// allocations and their collection).
func eachField(raw []byte, wireOf func(field int32) int, fn func(p *pbReader, field int32) error) error {
	p := pbReader{b: raw}
	for {
		field, ok, err := nextField(&p, wireOf)
		if err != nil || !ok {
			return err
		}
		if err := fn(&p, field); err != nil {
			return err
		}
	}
}

// nextField reads the tag of p's next field whose wire type is the one
// wireOf expects for it, skipping the others, as eachField does; ok is
// false at the end of p.
func nextField(p *pbReader, wireOf func(field int32) int) (field int32, ok bool, err error) {
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return 0, false, err
		}
		if wire == wireOf(field) {
			return field, true, nil
		}
		if err := p.skip(wire); err != nil {
			return 0, false, err
		}
	}
	return 0, false, nil
}

// The wire types of each message's fields; -1 for fields not read.
func familyWire(f int32) int {
	switch f {
	case 1, 2, 4, 5: // name, help, metric, unit
		return wireBytes
	case 3: // type
		return wireVarint
	}
	return -1
}

func metricWire(f int32) int {
	switch f {
	case 1, 2, 3, 4, 5, 7: // label, gauge, counter, summary, untyped, histogram
		return wireBytes
	case 6: // timestamp_ms
		return wireVarint
	}
	return -1
}

func labelPairWire(f int32) int {
	if f == 1 || f == 2 { // name, value
		return wireBytes
	}
	return -1
}

func valueWire(f int32) int { // Gauge, Counter, Untyped: value; Quantile: quantile, value
	if f == 1 || f == 2 {
		return wireFixed64
	}
	return -1
}

func summaryWire(f int32) int {
	switch f {
	case 1: // sample_count
		return wireVarint
	case 2: // sample_sum
		return wireFixed64
	case 3: // quantile
		return wireBytes
	}
	return -1
}

func histogramWire(f int32) int {
	switch f {
	case 1: // sample_count
		return wireVarint
	case 2, 4: // sample_sum, sample_count_float
		return wireFixed64
	case 3: // bucket
		return wireBytes
	}
	return -1
}

func bucketWire(f int32) int {
	switch f {
	case 1: // cumulative_count
		return wireVarint
	case 2, 4: // upper_bound, cumulative_count_float
		return wireFixed64
	}
	return -1
}

// decodeFamily reads the family's name and type first (a message may carry
// its fields in any order), then converts its metrics.
func (d *familyRequest) decodeFamily(raw []byte, now int64) error {
	var f family
	p := pbReader{b: raw}
	for {
		field, ok, err := nextField(&p, familyWire)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if field == 3 {
			if f.typ, err = p.varint(); err != nil {
				return err
			}
			continue
		}
		b, err := p.bytes()
		if err != nil {
			return err
		}
		switch field {
		case 1:
			f.name = aliasString(b)
		case 2:
			f.help = aliasString(b)
		case 5:
			f.unit = aliasString(b)
		}
	}
	if f.name == "" {
		return errors.New("metric family without a name")
	}
	d.addMetadata(f)
	p = pbReader{b: raw}
	for {
		field, ok, err := nextField(&p, familyWire)
		if err != nil || !ok {
			return err
		}
		if field == 3 {
			if _, err := p.varint(); err != nil {
				return err
			}
			continue
		}
		msg, err := p.bytes()
		if err != nil {
			return err
		}
		if field != 4 {
			continue
		}
		if err := d.decodeMetric(f, msg, now); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
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
// fields this converter uses. A message field that appears more than once
// is merged, as protobuf does: the summary and histogram parts are kept.
type metric struct {
	value     float64 // gauge, counter or untyped
	ts        int64
	hasTS     bool
	summary   [][]byte
	histogram [][]byte
}

func (d *familyRequest) decodeMetric(f family, raw []byte, now int64) error {
	var m metric
	clear(d.pairs)
	d.pairs = d.pairs[:0]
	p := pbReader{b: raw}
	for {
		field, ok, err := nextField(&p, metricWire)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if field == 6 { // timestamp_ms
			v, err := p.varint()
			if err != nil {
				return err
			}
			m.ts, m.hasTS = int64(v), true
			continue
		}
		msg, err := p.bytes()
		if err != nil {
			return err
		}
		switch field {
		case 1: // label
			l, err := decodeLabelPair(msg)
			if err != nil {
				return err
			}
			d.pairs = append(d.pairs, l)
		case 2, 3, 5: // gauge, counter, untyped
			if err := decodeValue(msg, &m.value); err != nil {
				return err
			}
		case 4:
			m.summary = append(m.summary, msg)
		case 7:
			m.histogram = append(m.histogram, msg)
		}
	}
	var err error
	if d.restamp && m.hasTS {
		d.drift[tenseOf(m.ts, now)]++
	}
	if !m.hasTS || d.restamp {
		m.ts = now
	}
	switch f.typ {
	case familySummary:
		err = d.convertSummary(f.name, &m)
	case familyHistogram, familyGaugeHistogram:
		err = d.convertHistogram(f.name, &m)
	default: // counter, gauge, untyped and unknown types: the value as it is
		d.emit(f.name, &m, "", "", m.value)
	}
	return err
}

// decodeLabelPair decodes a LabelPair; its strings alias raw.
func decodeLabelPair(raw []byte) (prompb.Label, error) {
	var l prompb.Label
	p := pbReader{b: raw}
	for {
		field, ok, err := nextField(&p, labelPairWire)
		if err != nil || !ok {
			return l, err
		}
		b, err := p.bytes()
		if err != nil {
			return l, err
		}
		if field == 1 {
			l.Name = aliasString(b)
		} else {
			l.Value = aliasString(b)
		}
	}
}

// decodeValue sets *v to the value of a Gauge, Counter or Untyped message
// when it has one (the last one, as protobuf merges), else leaves it.
func decodeValue(raw []byte, v *float64) error {
	p := pbReader{b: raw}
	for {
		field, ok, err := nextField(&p, valueWire)
		if err != nil || !ok {
			return err
		}
		b, err := p.fixed64()
		if err != nil {
			return err
		}
		if field == 1 {
			*v = math.Float64frombits(b)
		}
	}
}

func (d *familyRequest) convertSummary(name string, m *metric) error {
	var count uint64
	var sum float64
	for _, part := range m.summary {
		err := eachField(part, summaryWire, func(p *pbReader, field int32) error {
			switch field {
			case 1:
				v, err := p.varint()
				count = v
				return err
			case 2:
				v, err := p.fixed64()
				sum = math.Float64frombits(v)
				return err
			}
			msg, err := p.bytes()
			if err != nil {
				return err
			}
			var q, v float64
			err = eachField(msg, valueWire, func(p *pbReader, field int32) error {
				b, err := p.fixed64()
				if field == 1 {
					q = math.Float64frombits(b)
				} else {
					v = math.Float64frombits(b)
				}
				return err
			})
			if err == nil {
				d.emit(name, m, model.QuantileLabel, formatFloat(q), v)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	d.emit(name+"_sum", m, "", "", sum)
	d.emit(name+"_count", m, "", "", float64(count))
	return nil
}

func (d *familyRequest) convertHistogram(name string, m *metric) error {
	var (
		count, countFloat, sum float64
		sawInf                 bool
	)
	bucket := name + "_bucket"
	for _, part := range m.histogram {
		err := eachField(part, histogramWire, func(p *pbReader, field int32) error {
			switch field {
			case 1:
				v, err := p.varint()
				count = float64(v)
				return err
			case 2, 4:
				v, err := p.fixed64()
				if field == 2 {
					sum = math.Float64frombits(v)
				} else {
					countFloat = math.Float64frombits(v)
				}
				return err
			}
			msg, err := p.bytes()
			if err != nil {
				return err
			}
			ub, v, err := decodeBucket(msg)
			if err == nil {
				sawInf = sawInf || math.IsInf(ub, 1)
				d.emit(bucket, m, model.BucketLabel, formatFloat(ub), v)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	if countFloat > 0 {
		count = countFloat
	}
	if !sawInf { // as Prometheus adds it when it scrapes a classic histogram
		d.emit(bucket, m, model.BucketLabel, "+Inf", count)
	}
	d.emit(name+"_sum", m, "", "", sum)
	d.emit(name+"_count", m, "", "", count)
	return nil
}

// decodeBucket returns a Bucket's upper bound and cumulative count (the
// float count when set).
func decodeBucket(raw []byte) (upper, count float64, err error) {
	var countFloat float64
	err = eachField(raw, bucketWire, func(p *pbReader, field int32) error {
		if field == 1 {
			v, err := p.varint()
			count = float64(v)
			return err
		}
		v, err := p.fixed64()
		if field == 2 {
			upper = math.Float64frombits(v)
		} else {
			countFloat = math.Float64frombits(v)
		}
		return err
	})
	if countFloat > 0 {
		count = countFloat
	}
	return upper, count, err
}

// emit appends one series: __name__=name, the metric's label pairs, and extraName=
// extraValue when set, sorted by name, with one sample.
func (d *familyRequest) emit(name string, m *metric, extraName, extraValue string, v float64) {
	if d.stopped != nil {
		return // decode refuses the upload; what is left of it is only parsed
	}
	if err := d.exp.spend(labelCost*int64(len(d.pairs)+2) + sampleCost + seriesCost); err != nil {
		d.stopped = err
		return
	}
	if err := d.exp.sample(); err != nil {
		d.stopped = err
		return
	}
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
