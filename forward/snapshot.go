package forward

import (
	"context"
	"time"
)

// arrivalStamper is a Sender whose server stores a delivery at the time it
// arrives, not at its samples' own timestamps: a stock telemeter-server
// overwrites every timestamp of an upload with its clock. To such a server
// a cycle is a snapshot of "now", as telemeter-client treats it, and the
// forwarder delivers it so (snapshots):
//   - a cycle is queued as one record, so it is one upload, as
//     telemeter-client's is: the server takes one upload per cluster per
//     4m30s, and a cycle split in several would be delivered over several
//     windows, its later parts by then superseded;
//   - a queued cycle that a later cycle follows is dropped (superseded)
//     instead of sent: delivered late, it would be stored as current
//     although it is not, and at one upload per cycle a backlog would
//     never shrink.
type arrivalStamper interface {
	StoresAtArrival() bool
	// LearnServer asks what the server is if nothing has told yet (at a
	// start: the authorizer's first answer), so that StoresAtArrival is
	// known; it returns when ctx ends or the answer (or a failure to get
	// one) is in.
	LearnServer(ctx context.Context)
	// WaitForWindow first learns the server (LearnServer), so that
	// StoresAtArrival is known before a record is chosen; then, for a
	// server that stores at arrival, it waits until the server takes the
	// next upload (its per-cluster rate limit). It returns an error only
	// when ctx ends. The record is chosen after it, so that a cycle queued
	// meanwhile supersedes the one waiting.
	WaitForWindow(ctx context.Context) error
}

// snapshots reports whether deliveries go to a server that stores them at
// their arrival (arrivalStamper).
func (f *Forwarder) snapshots() bool {
	s, ok := f.sender.(arrivalStamper)
	return ok && s.StoresAtArrival()
}

// learnServer learns, at most learnServerTimeout, what the server is if
// nothing has told yet (arrivalStamper), so that a cycle collected before
// the authorizer's first answer is queued as the server wants it: split
// into remote-write requests, or one upload for a stock telemeter-server,
// which would take the parts one per window, the later ones by then
// superseded. A server that does not answer in time gets the cycle split.
func (f *Forwarder) learnServer(ctx context.Context) {
	s, ok := f.sender.(arrivalStamper)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, f.opts.learnServerTimeout)
	defer cancel()
	s.LearnServer(ctx)
}

// waitForWindow waits until a server that stores uploads at their arrival
// takes the next one (arrivalStamper); at once for other servers.
func (f *Forwarder) waitForWindow(ctx context.Context) error {
	if s, ok := f.sender.(arrivalStamper); ok {
		return s.WaitForWindow(ctx)
	}
	return nil
}

// superseded reports whether the queued record taken at t is a snapshot
// that a later cycle's record replaces. Records of one cycle are queued
// within moments of each other, cycles at least Interval×(1-Jitter) apart.
// A record older than one and a half intervals is superseded too, by the
// next cycle: it is left from before a restart, or the collections have
// failed since, when telemeter-client would send nothing rather than an
// old cycle stored as current. (The latest cycle, chosen after the
// window's wait, is never that old while collections succeed.)
func (f *Forwarder) superseded(t time.Time) bool {
	if !f.snapshots() {
		return false
	}
	if f.q.opts.Now().Sub(t) > f.opts.Interval*3/2 {
		return true
	}
	newest, ok := f.q.Newest()
	return ok && newest.Sub(t) >= f.opts.Interval/2
}

// dropSuperseded acknowledges a superseded record without sending it.
func (f *Forwarder) dropSuperseded(pos Position, samples int) {
	f.m.dropped.WithLabelValues(ReasonSuperseded).Add(float64(samples))
	f.logCapOnce(ReasonSuperseded, "the telemeter-server stores an upload at the time it arrives: delivering the latest cycle, dropping the older ones (a later cycle is queued, or it is over one and a half intervals old)")
	f.ack(pos)
}

// The senders the forwarder binary uses say when they deliver snapshots.
var (
	_ arrivalStamper = (*ProtocolSender)(nil)
	_ arrivalStamper = (*TelemeterSender)(nil)
)
