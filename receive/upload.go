package receive

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/golang/snappy"
)

// protoFamilies names telemeter-client's upload format in the
// phonehome_receive_decoded_requests_total proto label.
const protoFamilies = "io.prometheus.client.MetricFamily"

// uploadContentType is the Content-Type /upload accepts, named in every 415
// so that a client learns what to send.
const uploadContentType = "application/vnd.google.protobuf; proto=" + protoFamilies + "; encoding=delimited"

// ServeUpload serves telemeter-client's POST /upload: delimited
// io.prometheus.client.MetricFamily messages in a snappy stream. Its series
// go through exactly the pipeline of remote-write (binding, limits, policy,
// the WAL before the answer) and its errors get the same status codes; only
// success is 200, not 204, because telemeter-client takes nothing else for
// success. It expects auth.Middleware in front of it, as ServeHTTP does.
func (h *Handler) ServeUpload(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, routeUpload)
}

// negotiateUpload checks an upload's Content-Type and Content-Encoding:
// telemeter-client sends application/vnd.google.protobuf with
// proto=io.prometheus.client.MetricFamily and encoding=delimited, in a
// snappy stream. The parameters are not required, and a body without
// Content-Encoding is taken as uncompressed; other values are 415. The
// coding is matched without regard to case, as HTTP defines it and
// telemeter-server matches it (strings.EqualFold in its Snappy middleware).
func negotiateUpload(hdr http.Header) error {
	if enc := hdr.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "snappy") {
		return fmt.Errorf("content-encoding %q, only snappy is supported: %w", enc, errUnsupported)
	}
	ct := hdr.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/vnd.google.protobuf" {
		return fmt.Errorf("content-type %q, want %s: %w", ct, uploadContentType, errUnsupported)
	}
	if p, ok := params["proto"]; ok && p != protoFamilies {
		return fmt.Errorf("content-type proto %q, want %s: %w", p, protoFamilies, errUnsupported)
	}
	if e, ok := params["encoding"]; ok && e != "delimited" {
		return fmt.Errorf("content-type encoding %q, want delimited: %w", e, errUnsupported)
	}
	return nil
}

// snappyStreamMagic opens every stream in snappy's framing format.
var snappyStreamMagic = []byte("\xff\x06\x00\x00sNaPpY")

// readUpload reads an upload body into buf and returns it decompressed,
// reusing dst. telemeter-client streams it in snappy's framing format,
// chunked, so the sizes are checked while reading: at most maxBody bytes as
// sent and maxDecoded once decompressed. A body in snappy's block format
// (what remote-write uses) is accepted too.
//
// It also returns how many bytes were read as sent.
func readUpload(r *http.Request, maxBody, maxDecoded int64, buf *bytesBuffer, dst []byte) (out []byte, sentBytes int64, err error) {
	if r.ContentLength > maxBody {
		return nil, 0, fmt.Errorf("body of %d bytes exceeds the limit of %d bytes: %w", r.ContentLength, maxBody, errTooLarge)
	}
	body := &io.LimitedReader{R: r.Body, N: maxBody + 1}
	defer func() { sentBytes = maxBody + 1 - body.N }()
	if r.Header.Get("Content-Encoding") == "" { // uncompressed: both caps apply to the same bytes
		out, err = readAtMost(body, dst[:0], min(maxBody, maxDecoded))
		if errors.Is(err, errTooLarge) {
			err = fmt.Errorf("body exceeds the limit of %d bytes: %w", min(maxBody, maxDecoded), errTooLarge)
		} else if err != nil {
			err = fmt.Errorf("read body: %w: %w", errBadRequest, err)
		}
		return out, 0, err
	}
	out, err = readStream(body, maxBody, maxDecoded, buf, dst)
	return out, 0, err
}

func readStream(body *io.LimitedReader, maxBody, maxDecoded int64, buf *bytesBuffer, dst []byte) ([]byte, error) {
	sent := func(err error) error { // an error caused by the sent-size cap is 413
		if body.N <= 0 {
			return fmt.Errorf("body exceeds the limit of %d bytes: %w", maxBody, errTooLarge)
		}
		return err
	}
	head := make([]byte, len(snappyStreamMagic))
	n, err := io.ReadFull(body, head)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		if n == 0 {
			return dst[:0], nil // an empty upload: nothing to store
		}
	case err != nil:
		return nil, fmt.Errorf("read body: %w: %w", errBadRequest, err)
	}
	head = head[:n]
	if !bytes.Equal(head, snappyStreamMagic) { // block format: read it all, as remote-write does
		buf.body.Reset()
		buf.body.Write(head)
		if _, err := buf.body.ReadFrom(body); err != nil {
			return nil, sent(fmt.Errorf("read body: %w: %w", errBadRequest, err))
		}
		if int64(buf.body.Len()) > maxBody {
			return nil, sent(nil)
		}
		return decodeBlock(buf.body.Bytes(), maxDecoded, dst, &buf.res)
	}
	if buf.stream == nil {
		buf.stream = snappy.NewReader(nil)
	}
	buf.stream.Reset(io.MultiReader(bytes.NewReader(head), body))
	defer buf.stream.Reset(nil) // do not keep the request body
	out, err := readAtMost(reservingReader{buf.stream, &buf.res}, dst[:0], maxDecoded)
	switch {
	case errors.Is(err, errTooLarge):
		return nil, sent(fmt.Errorf("decoded size exceeds the limit of %d bytes: %w", maxDecoded, errTooLarge))
	case err != nil:
		return nil, sent(fmt.Errorf("snappy stream: %w: %w", errBadRequest, err))
	}
	return out, nil
}

// decodeBlock decodes a snappy block (remote-write's format) into dst,
// checking its declared size before allocating anything for it.
// The body and its decoded bytes are reserved (res, may be nil) first.
func decodeBlock(b []byte, maxDecoded int64, dst []byte, res *reservation) ([]byte, error) {
	n, err := snappy.DecodedLen(b)
	if err != nil {
		return nil, fmt.Errorf("snappy header: %w: %w", errBadRequest, err)
	}
	if int64(n) > maxDecoded {
		return nil, fmt.Errorf("decoded size of %d bytes exceeds the limit of %d bytes: %w", n, maxDecoded, errTooLarge)
	}
	if err := res.buffer(int64(n)); err != nil { // b was reserved as it was read
		return nil, err
	}
	if cap(dst) < n {
		dst = make([]byte, n)
	}
	out, err := snappy.Decode(dst[:cap(dst)], b)
	if err != nil {
		return nil, fmt.Errorf("snappy decode: %w: %w", errBadRequest, err)
	}
	return out, nil
}

// readAtMost appends r's content to dst, failing with errTooLarge once it
// exceeds max bytes; it grows dst at most to about max.
func readAtMost(r io.Reader, dst []byte, max int64) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		room := cap(dst) - len(dst)
		if over := int64(len(dst)+room) - (max + 1); over > 0 {
			room -= int(over)
		}
		n, err := r.Read(dst[len(dst) : len(dst)+room])
		dst = dst[:len(dst)+n]
		if int64(len(dst)) > max {
			return dst, errTooLarge
		}
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}
