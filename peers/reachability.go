package peers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/phonehome/phonehome/internal/periodic"
)

// A peer that cannot be connected to is skipped until it answers again, so
// that a replica that is gone (its node down, or a deleted pod whose address
// drops packets) does not hold every query for peers.timeout, once per
// selector, until DNS forgets it. A call that fails before it has a
// connection marks its peer unreachable; the peer's calls then fail at once
// (a warning, as any failed peer), and a probe asks its /-/ready every
// probeInterval. Any HTTP answer makes it reachable again. A mark lapses
// after probeInterval unless a failed probe renews it, so without the probe
// (Run not running) a real call tries again now and then. Run also asks
// every other peer's /-/ready each refresh interval, so that a replica
// without calls to a dead peer marks it too (health.go).
//
// A peer that accepts connections but answers nothing (a hung process, a
// node whose kernel still completes handshakes) would hold every query for
// peers.timeout just the same. A call that had a connection and reached its
// deadline says only that the peer is slow or hung, so its /-/ready is asked
// at once (checkHung): a peer that does not answer that either is marked as
// an unreachable one is; one that does is slow, and is asked again.

// probeInterval is how often an unreachable peer is probed, and how long a
// mark lasts without a probe (Set.probeEvery, shorter in tests).
const probeInterval = 5 * time.Second

// reachability is a peer's mark.
type reachability struct {
	mu    sync.Mutex
	since time.Time // when it was marked; zero: reachable
	until time.Time // calls fail at once before this
	err   error     // the failure that marked it
}

// errUnreachable is what a call to a marked peer fails with, at once.
var errUnreachable = errors.New("unreachable, skipped until it answers again")

// check returns an error if calls to the peer must fail at once.
func (r *reachability) check(now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.since.IsZero() || !now.Before(r.until) {
		return nil
	}
	return fmt.Errorf("%w (since %s: %w)", errUnreachable, r.since.UTC().Format(time.RFC3339), r.err)
}

// mark records a failure to connect at now, which marks the peer for d,
// and reports whether the peer was reachable before.
func (r *reachability) mark(now time.Time, d time.Duration, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := r.since.IsZero()
	if first {
		r.since, r.err = now, err
	}
	r.until = now.Add(d)
	return first
}

// clear makes the peer reachable and returns since when it was not (zero:
// it was reachable).
func (r *reachability) clear() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	since := r.since
	r.since, r.until, r.err = time.Time{}, time.Time{}, nil
	return since
}

func (r *reachability) marked() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.since.IsZero()
}

// roundTrip is base's round trip to p, failing at once while p is marked,
// and marking p when the request fails before it had a connection (a
// refused or unanswered dial, a failed TLS handshake), unless the caller
// cancelled it.
func (s *Set) roundTrip(p *peer, req *http.Request) (*http.Response, error) {
	if err := p.down.check(s.now()); err != nil {
		return nil, err
	}
	var connected atomic.Bool
	ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	})
	resp, err := s.base.RoundTrip(req.WithContext(ctx))
	switch {
	case err == nil || errors.Is(req.Context().Err(), context.Canceled):
	case !connected.Load():
		s.markUnreachable(p, err)
	case errors.Is(err, context.DeadlineExceeded):
		s.checkHung(p)
	}
	return resp, err
}

// checkHung probes p after a call that had a connection but no answer by
// its deadline, and marks p if the probe gets no answer either. One check
// per peer at a time; it ends within the probe's timeout.
func (s *Set) checkHung(p *peer) {
	if !p.checking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer p.checking.Store(false)
		if err := s.probe(context.Background(), p); err != nil {
			s.markUnreachable(p, fmt.Errorf("connected, but answered neither a call by its deadline nor /-/ready: %w", err))
		}
	}()
}

func (s *Set) markUnreachable(p *peer, err error) {
	if p.down.mark(s.now(), s.probeEvery, err) {
		s.logger.Warn("peer unreachable: skipping it in queries until it answers again", "peer", p.addr, "err", err)
	}
}

// probeLoop probes the unreachable peers every s.probeEvery until ctx
// ends.
func (s *Set) probeLoop(ctx context.Context) {
	periodic.Every(ctx, s.probeEvery, s.probeMarked)
}

// probeMarked probes every unreachable peer at once, and returns when each
// probe has (within the probe's timeout, before the marks lapse).
func (s *Set) probeMarked(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range s.snapshot() {
		if p.down.marked() {
			wg.Go(func() { _ = s.probe(ctx, p) })
		}
	}
	wg.Wait()
}

// probe asks p's /-/ready: any HTTP answer makes it reachable, a failure
// renews a mark. It returns the failure, nil if p answered (or ctx was
// cancelled).
func (s *Set) probe(ctx context.Context, p *peer) error {
	ctx, cancel := context.WithTimeout(ctx, min(s.probeEvery, time.Duration(s.cfg.Timeout)))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.Scheme+"://"+p.addr+"/-/ready", nil)
	if err != nil {
		return nil
	}
	resp, err := s.base.RoundTrip(req)
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			if p.down.marked() {
				p.down.mark(s.now(), s.probeEvery, err)
			}
			return err
		}
		return nil
	}
	_ = resp.Body.Close()
	s.recogniseSelf(p, resp) // if /-/ready carries InstanceHeader: never asked again
	if since := p.down.clear(); !since.IsZero() {
		s.logger.Info("peer reachable again", "peer", p.addr, "unreachable_for", s.now().Sub(since).Round(time.Second))
	}
	return nil
}

// unreachable counts the peers marked unreachable (a gauge's value).
func (s *Set) unreachable() float64 {
	n := 0
	for _, p := range s.snapshot() {
		if p.down.marked() {
			n++
		}
	}
	return float64(n)
}
