package receive

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/phonehome/phonehome/storage"
)

// inflightBytes bounds the memory that write requests hold at once across
// every tenant and cluster (Options.MaxInflightBytes): their bodies, decoded
// bytes and decoded structures. The per-request bounds (max_decoded_bytes,
// the expansion factors) let one crafted request take 0.8–2 GiB, and
// --receive.max-inflight-requests of them at once would take the process;
// this bounds the sum. Requests reserve as they read and decode, so an
// ordinary 100 KB write holds a few MB, and they return it when answered.
type inflightBytes struct {
	max  int64
	used atomic.Int64
}

// errOverloadedBytes refuses a write while the requests in flight hold
// Options.MaxInflightBytes.
var errOverloadedBytes = fmt.Errorf("%w: write requests in flight hold too much memory, retry later", storage.ErrNotReady)

// Values of phonehome_receive_overloaded_requests_total's limit label.
const (
	limitRequests = "requests" // Options.MaxInflight
	limitBytes    = "bytes"    // Options.MaxInflightBytes
)

// reserveStep is the smallest reservation taken at once; a reservation
// grows by at least a quarter of itself, so a request takes a few steps.
const reserveStep = 64 << 10

// take reserves n more bytes for a request that already holds held. It
// refuses what would pass max while other requests hold memory: a request
// alone is always served, however large, so a budget below one request's
// size cannot refuse it forever.
func (b *inflightBytes) take(n, held int64) bool {
	used := b.used.Add(n)
	if used > b.max && used-n-held > 0 {
		b.used.Add(-n)
		return false
	}
	return true
}

// reservation is one request's share of an inflightBytes. The zero value
// (no pool) reserves nothing and never refuses.
type reservation struct {
	pool *inflightBytes
	held int64
	// buffered is what the request's buffers hold (body, decoded bytes),
	// which its decoded structures add to.
	buffered int64
}

// limited reports whether the reservation has a pool to take from.
func (r *reservation) limited() bool { return r != nil && r.pool != nil }

// cover makes the reservation at least n bytes, or errOverloadedBytes.
func (r *reservation) cover(n int64) error {
	if !r.limited() || n <= r.held {
		return nil
	}
	more := max(n-r.held, r.held/4, reserveStep)
	if !r.pool.take(more, r.held) {
		return errOverloadedBytes
	}
	r.held += more
	return nil
}

// buffer records that the request's buffers hold n more bytes, covered.
func (r *reservation) buffer(n int64) error {
	if !r.limited() {
		return nil
	}
	r.buffered += n
	return r.cover(r.buffered)
}

// release returns what the request held; call it once it is answered.
func (r *reservation) release() {
	if r.limited() {
		r.pool.used.Add(-r.held)
	}
	*r = reservation{}
}

// reservingReader reserves the bytes read through it as they are read: a
// body of no declared length, a stream of no declared decoded size.
type reservingReader struct {
	r   io.Reader
	res *reservation
}

func (rr reservingReader) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	if n > 0 {
		if rerr := rr.res.buffer(int64(n)); rerr != nil {
			return n, rerr
		}
	}
	return n, err
}

// reservingBody wraps a request body in a reservingReader.
func reservingBody(body io.ReadCloser, res *reservation) io.ReadCloser {
	return struct {
		io.Reader
		io.Closer
	}{reservingReader{body, res}, body}
}
