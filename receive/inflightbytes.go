package receive

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/phonehome/phonehome/storage"
)

// inflightBytes bounds the memory that write requests hold at once across
// every tenant and cluster (Options.MaxInflightBytes): their bodies, decoded
// bytes and decoded structures. The per-request bounds (max_decoded_bytes,
// the expansion factors) let one crafted request take 0.8–2 GiB, and
// --receive.max-inflight-requests of them at once would take the process;
// this bounds the sum. Requests reserve as they read and decode, so an
// ordinary 100 KB write holds a few MB, and they return it when answered.
//
// Admission is first come, first served: a write that does not fit waits,
// up to inflightBytesWait, and the writes that come after it queue behind
// it rather than take what it waits for, so a write close to the limit is
// not starved by a stream of smaller ones. A write already admitted grows
// as it decodes, without queueing while what it asks for fits (the writes
// admitted are finite while others wait, so the queue still moves); when it
// does not fit, it waits ahead of the queue, unless an older write already
// waits to grow: then it gives way (refused at once, as before, returning
// what it holds), and a younger write waiting to grow gives way to it. So
// the one write that waits to grow is the oldest that asked, and it cannot
// wait for another write that waits for it.
// (golang.org/x/sync/semaphore.Weighted is FIFO as well, but there a write
// growing queues behind writes that wait for the memory it holds, and one
// larger than the whole budget never passes.)
type inflightBytes struct {
	max  int64
	wait time.Duration // inflightBytesWait; tests shorten it
	used atomic.Int64  // changed under mu; the gauge reads it without

	mu     sync.Mutex
	seq    uint64    // writes admitted so far: a reservation's age
	grower *waiter   // the oldest write in flight, waiting to grow: served first
	queue  []*waiter // writes waiting to be admitted, in arrival order
}

// inflightBytesWait is how long a write waits for memory before it is
// refused: the Retry-After of the refusal, after which its sender would
// have asked again anyway.
const inflightBytesWait = 5 * time.Second

// waiter is a write waiting for n more bytes.
type waiter struct {
	res   *reservation
	n     int64
	ready chan struct{} // closed once decided
	// Under inflightBytes.mu.
	decided, granted bool
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

// take reserves n more bytes for r, waiting its turn when they do not fit
// (see inflightBytes), and reports whether it got them.
func (b *inflightBytes) take(r *reservation, n int64) bool {
	b.mu.Lock()
	admitted := r.held > 0
	switch {
	case admitted && b.fits(n, r.held),
		!admitted && b.grower == nil && len(b.queue) == 0 && b.fits(n, 0):
		b.grant(r, n)
		b.mu.Unlock()
		return true
	case admitted && b.grower != nil && b.grower.res.seq < r.seq:
		b.mu.Unlock()
		return false // an older write waits to grow: this one gives way
	}
	w := &waiter{res: r, n: n, ready: make(chan struct{})}
	if admitted {
		if b.grower != nil {
			b.decide(b.grower, false) // younger: gives way
		}
		b.grower = w
	} else {
		b.queue = append(b.queue, w)
	}
	b.mu.Unlock()
	return b.await(w)
}

// fits reports whether n more bytes fit for a request that holds held: under
// max, or alone, since a request alone is always served, however large, so
// that a budget below one request's size cannot refuse it forever.
func (b *inflightBytes) fits(n, held int64) bool {
	used := b.used.Load()
	return used+n <= b.max || used == held
}

// grant gives r n more bytes; a first grant admits it.
func (b *inflightBytes) grant(r *reservation, n int64) {
	if r.held == 0 {
		b.seq++
		r.seq = b.seq
	}
	b.used.Add(n)
	r.held += n
}

func (b *inflightBytes) decide(w *waiter, granted bool) {
	if granted {
		b.grant(w.res, w.n)
	}
	w.decided, w.granted = true, granted
	close(w.ready)
}

// await waits until w is decided, its wait runs out, or its request's
// context ends.
func (b *inflightBytes) await(w *waiter) bool {
	timer := time.NewTimer(b.wait)
	defer timer.Stop()
	var gone <-chan struct{}
	if w.res.ctx != nil {
		gone = w.res.ctx.Done()
	}
	select {
	case <-w.ready:
	case <-timer.C:
	case <-gone:
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.decided {
		return w.granted
	}
	if b.grower == w {
		b.grower = nil
	} else {
		i := slices.Index(b.queue, w)
		b.queue = slices.Delete(b.queue, i, i+1)
	}
	b.serve() // w may have held up those behind it
	return false
}

// give returns n bytes and serves the writes waiting in order.
func (b *inflightBytes) give(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used.Add(-n)
	b.serve()
}

// serve grants what the waiting writes ask in order, the grower first,
// and stops at the first that does not fit: no write overtakes another.
func (b *inflightBytes) serve() {
	if g := b.grower; g != nil {
		if !b.fits(g.n, g.res.held) {
			return
		}
		b.grower = nil
		b.decide(g, true)
	}
	for len(b.queue) > 0 && b.fits(b.queue[0].n, 0) {
		w := b.queue[0]
		b.queue[0] = nil
		b.queue = b.queue[1:]
		b.decide(w, true)
	}
}

// waiting is the number of writes waiting for memory.
func (b *inflightBytes) waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.queue)
	if b.grower != nil {
		n++
	}
	return n
}

// reservation is one request's share of an inflightBytes. The zero value
// (no pool) reserves nothing and never refuses.
type reservation struct {
	pool *inflightBytes
	ctx  context.Context // the request's: a write whose client left stops waiting
	held int64
	seq  uint64 // when it was admitted (inflightBytes.seq); under pool.mu
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
	if !r.pool.take(r, max(n-r.held, r.held/4, reserveStep)) {
		return errOverloadedBytes
	}
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
	if r.limited() && r.held > 0 {
		r.pool.give(r.held)
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
