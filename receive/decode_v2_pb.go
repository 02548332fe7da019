package receive

import (
	"fmt"
	"io"
	"math"

	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// v2Request is a decoded remote-write 2.0 request, and the conversion of
// it, whose storage is reused from one request to the next, as v1Request's:
// once the slices have grown, a fleet's steady stream of similar requests
// decodes and converts without allocating.
//
// Symbols are not copied: they alias the decoded body, with the same rules
// as v1Request's label strings. convertV2 hands storage the metadata strings
// (and the metric names of series with metadata) as copies, since storage
// keeps those as given; everything else that outlives the request copies
// what it keeps.
type v2Request struct {
	req     writev2.Request
	refs    []uint32         // every series' labels_refs
	samples []writev2.Sample // every series' samples
	spans   []seriesSpan     // labels: a series' range of refs

	conv v2Conversion
	exp  expansion // decoding's and convertV2's
	// maxSamples, when set before decoding, refuses a request of more
	// samples than the limits admit at once (errTooLarge).
	maxSamples int
	// res, when set before decoding, reserves the memory decoding takes
	// (Options.MaxInflightBytes); nil reserves nothing.
	res *reservation
}

// decodeV2 unmarshals a remote-write 2.0 request into d, replacing what d
// held, and checks the request-wide rule: a request with series has a symbol
// table whose first symbol is "". Per-series rules are checked by convertV2,
// so one bad series does not refuse the others.
//
// It accepts exactly what the generated writev2 code accepts (a fuzz test
// compares the two) and produces the same request; histograms and
// exemplars, which telemetry rarely carries, and each series' metadata (a
// few integers, decoded in place) are left to the generated code. Unknown
// fields are skipped, not kept.
func decodeV2(raw []byte, d *v2Request) error {
	if err := d.decode(raw); err != nil {
		d.reset()
		if limitErr(err) {
			return fmt.Errorf("protobuf decode: %w", err)
		}
		return fmt.Errorf("protobuf decode: %w: %w", errBadRequest, err)
	}
	if len(d.req.Timeseries) > 0 || len(d.req.Symbols) > 0 {
		if len(d.req.Symbols) == 0 || d.req.Symbols[0] != "" {
			return fmt.Errorf("symbols[0] must be the empty string: %w", errBadRequest)
		}
	}
	return nil
}

// poolable reports whether d is within the bounds of what the pool keeps
// (see putBuffer). The conversion's series, metadata and refusals grow with
// the request's series, its arenas with its labels and samples.
func (d *v2Request) poolable() bool {
	c := &d.conv
	return cap(d.req.Timeseries) <= maxPooledSeries && cap(d.spans) <= maxPooledSeries &&
		cap(c.series) <= maxPooledSeries && cap(c.meta) <= maxPooledSeries && cap(c.invalid) <= maxPooledSeries &&
		cap(d.req.Symbols) <= maxPooledLabels && cap(c.owned) <= maxPooledLabels &&
		cap(d.refs) <= 2*maxPooledLabels && cap(c.labels) <= maxPooledLabels &&
		cap(d.samples) <= maxPooledLabels && cap(c.samples) <= maxPooledLabels
}

func (d *v2Request) reset() {
	clear(d.req.Symbols) // drop references into the previous body
	clear(d.req.Timeseries)
	d.req = writev2.Request{Symbols: d.req.Symbols[:0], Timeseries: d.req.Timeseries[:0]}
	d.refs, d.samples, d.spans = d.refs[:0], d.samples[:0], d.spans[:0]
}

func (d *v2Request) decode(raw []byte) error {
	d.reset()
	d.exp = newExpansion(len(raw), expansionFactorV2, d.maxSamples, d.res)
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return err
		}
		switch field {
		case 4: // symbols
			if wire != 2 {
				return fmt.Errorf("proto: wrong wireType = %d for field Symbols", wire)
			}
			b, err := p.bytes()
			if err != nil {
				return err
			}
			if err := d.exp.spend(symbolCost); err != nil {
				return err
			}
			d.req.Symbols = append(d.req.Symbols, aliasString(b))
		case 5: // timeseries
			msg, err := p.message(wire, "Timeseries")
			if err != nil {
				return err
			}
			if err := d.exp.spend(seriesV2Cost); err != nil {
				return err
			}
			d.req.Timeseries = append(d.req.Timeseries, writev2.TimeSeries{})
			d.spans = append(d.spans, seriesSpan{})
			if err := d.decodeSeries(msg, &d.req.Timeseries[len(d.req.Timeseries)-1], &d.spans[len(d.spans)-1]); err != nil {
				return err
			}
		default:
			if err := p.skip(wire); err != nil {
				return err
			}
		}
	}
	for i := range d.req.Timeseries {
		ts, sp := &d.req.Timeseries[i], d.spans[i]
		ts.LabelsRefs = d.refs[sp.labels[0]:sp.labels[1]:sp.labels[1]]
		ts.Samples = d.samples[sp.samples[0]:sp.samples[1]:sp.samples[1]]
	}
	return nil
}

func (d *v2Request) decodeSeries(raw []byte, ts *writev2.TimeSeries, sp *seriesSpan) error {
	sp.labels = [2]int32{int32(len(d.refs)), int32(len(d.refs))}
	sp.samples = [2]int32{int32(len(d.samples)), int32(len(d.samples))}
	if len(d.refs) > math.MaxInt32-len(raw) || len(d.samples) > math.MaxInt32-len(raw) {
		return errIntOverflow // unreachable within any body size limit; keeps the int32 spans honest
	}
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return err
		}
		switch field {
		case 1: // labels_refs, packed or not
			n := len(d.refs)
			if d.refs, err = p.appendUint32s(d.refs, wire, "LabelsRefs"); err != nil {
				return err
			}
			if err := d.exp.spend(refCost * int64(len(d.refs)-n)); err != nil {
				return err
			}
			sp.labels[1] += int32(len(d.refs) - n)
		case 2: // samples
			msg, err := p.message(wire, "Samples")
			if err != nil {
				return err
			}
			s, err := decodeSampleV2(msg)
			if err != nil {
				return err
			}
			if err := d.exp.spend(sampleV2Cost); err != nil {
				return err
			}
			if err := d.exp.sample(); err != nil {
				return err
			}
			d.samples = append(d.samples, s)
			sp.samples[1]++
		case 3: // histograms
			if ts.Histograms, err = appendGenerated(&p, &d.exp, wire, "Histograms", ts.Histograms); err != nil {
				return err
			}
		case 4: // exemplars
			if ts.Exemplars, err = appendGenerated(&p, &d.exp, wire, "Exemplars", ts.Exemplars); err != nil {
				return err
			}
		case 5: // metadata: merged into what an earlier occurrence set, as protobuf does
			msg, err := p.message(wire, "Metadata")
			if err != nil {
				return err
			}
			if err := ts.Metadata.Unmarshal(msg); err != nil {
				return err
			}
		default:
			if err := p.skip(wire); err != nil {
				return err
			}
		}
	}
	return nil
}

// appendUint32s appends a repeated uint32 field, one varint (wire type 0) or
// packed (2), to dst. Like the generated code, it reads the last packed
// varint to its end even when that lies past the field's length, and
// carries on from there.
func (p *pbReader) appendUint32s(dst []uint32, wire int, name string) ([]uint32, error) {
	switch wire {
	case 0:
		v, err := p.varint()
		if err != nil {
			return dst, err
		}
		return append(dst, uint32(v)), nil
	case 2:
		n, err := p.varint()
		if err != nil {
			return dst, err
		}
		l := int(n)
		if l < 0 {
			return dst, errInvalidLength
		}
		end := p.i + l
		if end < 0 {
			return dst, errInvalidLength
		}
		if end > len(p.b) {
			return dst, io.ErrUnexpectedEOF
		}
		for p.i < end {
			v, err := p.varint()
			if err != nil {
				return dst, err
			}
			dst = append(dst, uint32(v))
		}
		return dst, nil
	default:
		return dst, fmt.Errorf("proto: wrong wireType = %d for field %s", wire, name)
	}
}

func decodeSampleV2(raw []byte) (writev2.Sample, error) {
	var s writev2.Sample
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return s, err
		}
		switch field {
		case 1:
			if wire != 1 {
				return s, fmt.Errorf("proto: wrong wireType = %d for field Value", wire)
			}
			v, err := p.fixed64()
			if err != nil {
				return s, err
			}
			s.Value = math.Float64frombits(v)
		case 2, 3:
			if wire != 0 {
				return s, fmt.Errorf("proto: wrong wireType = %d for field %s", wire, [...]string{2: "Timestamp", 3: "StartTimestamp"}[field])
			}
			v, err := p.varint()
			if err != nil {
				return s, err
			}
			if field == 2 {
				s.Timestamp = int64(v)
			} else {
				s.StartTimestamp = int64(v)
			}
		default:
			if err := p.skip(wire); err != nil {
				return s, err
			}
		}
	}
	return s, nil
}
