package receive

import (
	"errors"
	"fmt"
	"io"
	"math"
	"unsafe"

	"github.com/prometheus/prometheus/prompb"
)

// v1Request is a decoded remote-write 1.0 request whose storage is reused
// from one request to the next: decoding a fleet's steady stream of similar
// requests allocates nothing once the slices have grown.
//
// Label names and values are not copied: they alias the decoded body, which
// must stay unchanged while the request is in use and must not be reused
// before. Everything that keeps a label string beyond the request copies it
// (labels.ScratchBuilder for TSDB series, the limiter's interner for names);
// a test overwrites the body after each request to hold that true.
type v1Request struct {
	req     prompb.WriteRequest
	labels  []prompb.Label
	samples []prompb.Sample
	spans   []seriesSpan
	exp     expansion
	// maxSamples, when set before decoding, refuses a request of more
	// samples than the limits admit at once (errTooLarge).
	maxSamples int
	// res, when set before decoding, reserves the memory decoding takes
	// (Options.MaxInflightBytes); nil reserves nothing.
	res *reservation
}

// seriesSpan locates one series' labels and samples in v1Request's slices;
// the slices may move while they grow, so TimeSeries point into them only
// once decoding is done.
type seriesSpan struct {
	labels, samples [2]int32
}

var (
	errInvalidLength = errors.New("proto: negative length found during unmarshaling")
	errIntOverflow   = errors.New("proto: integer overflow")
)

// decodeV1 unmarshals a remote-write 1.0 request into d, replacing what d
// held. It accepts exactly what the generated prompb code accepts (a fuzz
// test compares the two) and produces the same series, labels and samples;
// exemplars, histograms and metadata, which telemetry rarely carries, are
// decoded by the generated code. Unknown fields are skipped; unlike the
// generated code, they are not kept (XXX_unrecognized), so forward mode does
// not pass them upstream.
func decodeV1(raw []byte, d *v1Request) error {
	if err := d.decode(raw); err != nil {
		d.reset()
		if limitErr(err) {
			return fmt.Errorf("protobuf decode: %w", err)
		}
		return fmt.Errorf("protobuf decode: %w: %w", errBadRequest, err)
	}
	return nil
}

func (d *v1Request) reset() {
	clear(d.req.Timeseries) // drop references into the previous body
	clear(d.req.Metadata)
	clear(d.labels)
	d.req = prompb.WriteRequest{Timeseries: d.req.Timeseries[:0], Metadata: d.req.Metadata[:0]}
	d.labels, d.samples, d.spans = d.labels[:0], d.samples[:0], d.spans[:0]
}

func (d *v1Request) decode(raw []byte) error {
	d.reset()
	d.exp = newExpansion(len(raw), expansionFactor, d.maxSamples, d.res)
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return err
		}
		switch field {
		case 1: // timeseries
			msg, err := p.message(wire, "Timeseries")
			if err != nil {
				return err
			}
			if err := d.exp.spend(seriesCost); err != nil {
				return err
			}
			d.req.Timeseries = append(d.req.Timeseries, prompb.TimeSeries{})
			d.spans = append(d.spans, seriesSpan{})
			if err := d.decodeSeries(msg, &d.req.Timeseries[len(d.req.Timeseries)-1], &d.spans[len(d.spans)-1]); err != nil {
				return err
			}
		case 3: // metadata
			if d.req.Metadata, err = appendGenerated(&p, &d.exp, wire, "Metadata", d.req.Metadata); err != nil {
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
		// Full slice expressions: appending to one series' labels (the
		// _id a validation adds) must not overwrite the next series'.
		ts.Labels = d.labels[sp.labels[0]:sp.labels[1]:sp.labels[1]]
		ts.Samples = d.samples[sp.samples[0]:sp.samples[1]:sp.samples[1]]
	}
	return nil
}

func (d *v1Request) decodeSeries(raw []byte, ts *prompb.TimeSeries, sp *seriesSpan) error {
	sp.labels = [2]int32{int32(len(d.labels)), int32(len(d.labels))}
	sp.samples = [2]int32{int32(len(d.samples)), int32(len(d.samples))}
	if len(d.labels) > math.MaxInt32-len(raw) || len(d.samples) > math.MaxInt32-len(raw) {
		return errIntOverflow // unreachable within any body size limit; keeps the int32 spans honest
	}
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return err
		}
		switch field {
		case 1: // labels
			msg, err := p.message(wire, "Labels")
			if err != nil {
				return err
			}
			l, err := decodeLabel(msg)
			if err != nil {
				return err
			}
			if err := d.exp.spend(labelCost); err != nil {
				return err
			}
			d.labels = append(d.labels, l)
			sp.labels[1]++
		case 2: // samples
			msg, err := p.message(wire, "Samples")
			if err != nil {
				return err
			}
			s, err := decodeSample(msg)
			if err != nil {
				return err
			}
			if err := d.exp.spend(sampleCost); err != nil {
				return err
			}
			if err := d.exp.sample(); err != nil {
				return err
			}
			d.samples = append(d.samples, s)
			sp.samples[1]++
		case 3: // exemplars
			if ts.Exemplars, err = appendGenerated(&p, &d.exp, wire, "Exemplars", ts.Exemplars); err != nil {
				return err
			}
		case 4: // histograms
			if ts.Histograms, err = appendGenerated(&p, &d.exp, wire, "Histograms", ts.Histograms); err != nil {
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

// generated is a message type with gogo-generated decoding.
type generated[T any] interface {
	*T
	Unmarshal([]byte) error
}

// appendGenerated reads the embedded message field name from p and decodes
// it into a new last element of s with the generated code, for the fields
// telemetry rarely carries, charging exp for what it may become.
func appendGenerated[T any, P generated[T]](p *pbReader, exp *expansion, wire int, name string, s []T) ([]T, error) {
	msg, err := p.message(wire, name)
	if err != nil {
		return s, err
	}
	var zero T
	if err := exp.spend(int64(unsafe.Sizeof(zero)) + generatedFactor*int64(len(msg))); err != nil {
		return s, err
	}
	s = append(s, zero)
	return s, P(&s[len(s)-1]).Unmarshal(msg)
}

func decodeLabel(raw []byte) (prompb.Label, error) {
	var l prompb.Label
	p := pbReader{b: raw}
	for !p.done() {
		field, wire, err := p.tag()
		if err != nil {
			return l, err
		}
		switch field {
		case 1, 2:
			if wire != 2 {
				return l, fmt.Errorf("proto: wrong wireType = %d for field %s", wire, [...]string{1: "Name", 2: "Value"}[field])
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
		default:
			if err := p.skip(wire); err != nil {
				return l, err
			}
		}
	}
	return l, nil
}

func decodeSample(raw []byte) (prompb.Sample, error) {
	var s prompb.Sample
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
		case 2:
			if wire != 0 {
				return s, fmt.Errorf("proto: wrong wireType = %d for field Timestamp", wire)
			}
			v, err := p.varint()
			if err != nil {
				return s, err
			}
			s.Timestamp = int64(v)
		default:
			if err := p.skip(wire); err != nil {
				return s, err
			}
		}
	}
	return s, nil
}

// pbReader reads protobuf wire format, with the checks and errors of the
// gogo/protobuf generated code.
type pbReader struct {
	b []byte
	i int
}

func (p *pbReader) done() bool { return p.i >= len(p.b) }

func (p *pbReader) varint() (uint64, error) {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if shift >= 64 {
			return 0, errIntOverflow
		}
		if p.i >= len(p.b) {
			return 0, io.ErrUnexpectedEOF
		}
		c := p.b[p.i]
		p.i++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, nil
		}
	}
}

// tag reads a field key.
func (p *pbReader) tag() (field int32, wire int, err error) {
	v, err := p.varint()
	if err != nil {
		return 0, 0, err
	}
	field, wire = int32(v>>3), int(v&7)
	if wire == 4 {
		return 0, 0, errors.New("proto: wiretype end group for non-group")
	}
	if field <= 0 {
		return 0, 0, fmt.Errorf("proto: illegal tag %d (wire type %d)", field, wire)
	}
	return field, wire, nil
}

// bytes reads a length-delimited field's payload.
func (p *pbReader) bytes() ([]byte, error) {
	n, err := p.varint()
	if err != nil {
		return nil, err
	}
	l := int(n)
	if l < 0 {
		return nil, errInvalidLength
	}
	end := p.i + l
	if end < 0 {
		return nil, errInvalidLength
	}
	if end > len(p.b) {
		return nil, io.ErrUnexpectedEOF
	}
	b := p.b[p.i:end]
	p.i = end
	return b, nil
}

// message reads an embedded message field, which must be length-delimited.
func (p *pbReader) message(wire int, name string) ([]byte, error) {
	if wire != 2 {
		return nil, fmt.Errorf("proto: wrong wireType = %d for field %s", wire, name)
	}
	return p.bytes()
}

func (p *pbReader) fixed64() (uint64, error) {
	if p.i+8 > len(p.b) {
		return 0, io.ErrUnexpectedEOF
	}
	b := p.b[p.i : p.i+8]
	p.i += 8
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56, nil
}

// skip passes over a field this decoder does not use, as gogo's skip
// functions do, groups included.
func (p *pbReader) skip(wire int) error {
	depth := 0
	for {
		switch wire {
		case 0:
			if _, err := p.varint(); err != nil {
				return err
			}
		case 1:
			if _, err := p.fixed64(); err != nil {
				return err
			}
		case 2:
			if _, err := p.bytes(); err != nil {
				return err
			}
		case 3:
			depth++
		case 4:
			if depth == 0 {
				return errors.New("proto: unexpected end of group")
			}
			depth--
		case 5:
			if p.i+4 > len(p.b) {
				return io.ErrUnexpectedEOF
			}
			p.i += 4
		default:
			return fmt.Errorf("proto: illegal wireType %d", wire)
		}
		if depth == 0 {
			return nil
		}
		v, err := p.varint()
		if err != nil {
			return err
		}
		wire = int(v & 7)
	}
}
