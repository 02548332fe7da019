package forward

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"
)

// DefaultTelemeterRateLimit is telemeter-server's default --ratelimit: it
// takes one upload per cluster in this window (a token bucket of one, per
// _id) and answers 429, without Retry-After, to any other.
const DefaultTelemeterRateLimit = 4*time.Minute + 30*time.Second

// uploadPacer keeps a TelemeterSender within telemeter-server's per-cluster
// upload rate limit. telemeter-client waits a full --interval after each
// cycle, so it never meets the limit; the forwarder does: its intervals are
// jittered (half of them shorter than 4m30s), a cycle may fill several
// batches, and a backlog is sent batch after batch. Each 429 would count as
// a failed send in federate_requests_failed_total and fire the cluster's
// TelemeterClientFailures. So once the server has answered 429 without
// Retry-After (its limiter), every upload first waits until the window
// since the last upload the server counted has passed.
type uploadPacer struct {
	window time.Duration // <= 0: never wait
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error // nil: Sleep

	mu      sync.Mutex
	limited bool      // the server has shown its limiter
	last    time.Time // the last upload the limiter counted
}

// wait blocks until an upload may go out, or ctx ends.
func (p *uploadPacer) wait(ctx context.Context) error {
	if d := p.remaining(); d > 0 {
		if p.sleep != nil {
			return p.sleep(ctx, d)
		}
		return Sleep(ctx, d)
	}
	return nil
}

func (p *uploadPacer) remaining() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.limited || p.window <= 0 || p.last.IsZero() {
		return 0
	}
	return p.last.Add(p.window).Sub(p.now())
}

// answered records the outcome of an upload, just answered, and returns
// err, with the wait until the window ends as the Retry-After of a 429 of
// telemeter-server's limiter. An upload counts from its answer, not from
// when it was sent: the server's limiter counted it at its arrival, in
// between, so a window measured from the send would end early by the
// network's latency, and the next upload be refused. Calls of wait and answered are meant
// to come from one upload at a time (the forwarder's send loop). The limiter counts every upload it
// lets through, whatever comes after it; it sits behind authentication, so
// a 401 does not count, and its own 429 does not either.
func (p *uploadPacer) answered(err error) error {
	if p.window <= 0 {
		return err
	}
	var he *HTTPError
	if !errors.As(err, &he) { // success, or no answer at all
		if err == nil {
			p.counted(p.now())
		}
		return err
	}
	switch {
	case he.Code == http.StatusUnauthorized:
		return err
	case he.Code != http.StatusTooManyRequests:
		p.counted(p.now())
		return err
	}
	var re RetryableError
	if errors.As(err, &re) && re.RetryAfter > 0 {
		return err // not telemeter-server's limiter, which sends none
	}
	p.mu.Lock()
	p.limited = true
	now := p.now()
	if !p.last.Add(p.window).After(now) {
		// The limiter counted an upload this sender does not know of (of
		// a previous process, say): assume it was just now.
		p.last = now
	}
	after := p.last.Add(p.window).Sub(now)
	p.mu.Unlock()
	return RetryableError{Err: err, RetryAfter: after}
}

func (p *uploadPacer) counted(at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at.After(p.last) {
		p.last = at
	}
}
