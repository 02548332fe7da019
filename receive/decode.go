package receive

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/golang/snappy"
)

// Error classes, mapped to HTTP status codes by statusFor alone.
var (
	errBadRequest  = errors.New("bad request")
	errTooLarge    = errors.New("request too large")
	errUnsupported = errors.New("unsupported media type")
)

// Remote-write protobuf messages, as named by the Content-Type proto parameter.
const (
	protoV1 = "prometheus.WriteRequest"
	protoV2 = "io.prometheus.write.v2.Request"
)

// bufPool recycles request and snappy buffers; a telemetry fleet sends many
// similar small requests, so reuse removes most per-request garbage.
var bufPool = sync.Pool{New: func() any { return new(bytesBuffer) }}

// bytesBuffer holds the buffers one request needs: the body, its snappy
// decoding, and the 1.0 or 2.0 request or telemeter upload decoded from it
// (whose strings alias decoded).
type bytesBuffer struct {
	body    bytes.Buffer
	decoded []byte
	v1      v1Request
	v2      v2Request
	fam     familyRequest
	stream  *snappy.Reader // framed snappy of uploads; nil until the first
	res     reservation    // the request's share of Options.MaxInflightBytes
}

// negotiate checks the Content-Type and Content-Encoding of a remote-write
// request and returns the protobuf message it carries, one of accepted (nil
// means both versions), as the 2.0 spec says: application/x-protobuf alone
// or with proto=prometheus.WriteRequest is 1.0, with
// proto=io.prometheus.write.v2.Request it is 2.0, anything else is 415.
func negotiate(h http.Header, accepted []string) (string, error) {
	if enc := h.Get("Content-Encoding"); enc != "" && enc != "snappy" {
		return "", fmt.Errorf("content-encoding %q, only snappy is supported: %w", enc, errUnsupported)
	}
	if accepted == nil {
		accepted = []string{protoV1, protoV2}
	}
	proto := protoV1 // remote-write 1.0 senders predating the spec send no Content-Type
	if ct := h.Get("Content-Type"); ct != "" {
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/x-protobuf" { // err: a malformed parameter too ("...;proto")
			return "", fmt.Errorf("content-type %q, want application/x-protobuf (proto=%s): %w", ct, strings.Join(accepted, " or proto="), errUnsupported)
		}
		if p, ok := params["proto"]; ok {
			proto = p
		}
	}
	if !slices.Contains(accepted, proto) {
		return "", fmt.Errorf("content-type proto %q, this receiver accepts %s: %w", proto, strings.Join(accepted, ", "), errUnsupported)
	}
	return proto, nil
}

// readBody reads at most maxBody bytes of a snappy body into buf and returns
// the snappy-decoded bytes in dst. Sizes are checked before any allocation
// that depends on them.
func readBody(r *http.Request, maxBody, maxDecoded int64, buf *bytes.Buffer, dst []byte, res *reservation) ([]byte, error) {
	if r.ContentLength > maxBody {
		return nil, fmt.Errorf("body of %d bytes exceeds the limit of %d bytes: %w", r.ContentLength, maxBody, errTooLarge)
	}
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, maxBody+1)); err != nil {
		return nil, fmt.Errorf("read body: %w: %w", errBadRequest, err)
	}
	if int64(buf.Len()) > maxBody {
		return nil, fmt.Errorf("body exceeds the limit of %d bytes: %w", maxBody, errTooLarge)
	}
	return decodeBlock(buf.Bytes(), maxDecoded, dst, res)
}

// Bounds on what a pooled buffer keeps: a rare huge request (up to the
// decoded-size limit, e.g. millions of tiny series) must not pin its peak
// memory in the pool. Fleet requests are far below these.
const (
	maxPooledBytes  = 8 << 20
	maxPooledSeries = 1 << 16
	maxPooledLabels = 1 << 20
)

// putBuffer returns b to the pool unless it grew beyond the bounds.
func putBuffer(b *bytesBuffer) {
	if b.poolable() {
		bufPool.Put(b)
	}
}

func (b *bytesBuffer) poolable() bool {
	return b.body.Cap() <= maxPooledBytes && cap(b.decoded) <= maxPooledBytes &&
		cap(b.v1.req.Timeseries) <= maxPooledSeries && cap(b.v1.labels) <= maxPooledLabels && cap(b.v1.samples) <= maxPooledLabels &&
		b.v2.poolable() && b.fam.poolable()
}
