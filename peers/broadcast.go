package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// OriginHeader (request) marks an admin call that a replica repeats on its
// peers, with that replica's instance id: the peer acts on it alone and does
// not repeat it further, and a receiver that finds its own id (a headless
// Service lists every pod, itself included) does nothing.
const OriginHeader = "X-Phonehome-Origin"

// maxBroadcastAnswer bounds the part of a peer's answer kept: an admin
// call's answer is one job's status.
const maxBroadcastAnswer = 1 << 20

// Answer is one peer's answer to a Broadcast: its status code and body, or
// the error that kept it from answering.
type Answer struct {
	Peer string
	Code int
	Body []byte
	Err  error
}

// Broadcast repeats an admin call on every current peer at once: a POST of
// body (JSON) to path, with the caller's own Authorization header (an admin
// credential is valid on every replica; the replica token is not used, as it
// only reads), and OriginHeader. Each call is bounded by peers.timeout, and
// tried even on a peer that queries skip as unreachable: an admin call that
// a replica misses must be reported, not assumed. The peers this receiver
// knows to be itself are left out, and an answer that turns out to be its
// own is dropped. Answers are in peer address order.
func (s *Set) Broadcast(ctx context.Context, path, authorization string, body []byte) []Answer {
	ps := s.snapshot()
	answers := make([]Answer, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { answers[i] = s.call(ctx, p, path, authorization, body) })
	}
	wg.Wait()
	out := answers[:0]
	for _, a := range answers {
		if a.Peer != "" {
			out = append(out, a)
		}
	}
	return out
}

// errNotPeer is Repeat's error for an address that is not among the peers
// (any more): it left discovery.
var errNotPeer = errors.New("not one of the peers")

// Peers returns the addresses of the current peers, this receiver left
// out, sorted: those a Broadcast calls.
func (s *Set) Peers() []string {
	ps := s.snapshot()
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.addr
	}
	return out
}

// Repeat makes the call of a Broadcast on the one peer at addr, to retry
// it there: an Answer with errNotPeer if addr is no longer a peer, a zero
// Answer if it turns out to be this receiver.
func (s *Set) Repeat(ctx context.Context, addr, path, authorization string, body []byte) Answer {
	s.mu.Lock()
	p, ok := s.peers[addr]
	s.mu.Unlock()
	switch {
	case !ok:
		return Answer{Peer: addr, Err: fmt.Errorf("%s: %w", addr, errNotPeer)}
	case p.self.Load():
		return Answer{}
	}
	return s.call(ctx, p, path, authorization, body)
}

// call makes one Broadcast call; a zero Answer means p is this receiver.
func (s *Set) call(ctx context.Context, p *peer, path, authorization string, body []byte) Answer {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.Timeout))
	defer cancel()
	a := Answer{Peer: p.addr}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.Scheme+"://"+p.addr+path, bytes.NewReader(body))
	if err != nil {
		a.Err = err
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(OriginHeader, s.instance)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := s.base.RoundTrip(req)
	if err != nil {
		a.Err = err
		return a
	}
	defer resp.Body.Close()
	if s.recogniseSelf(p, resp) {
		return Answer{}
	}
	a.Code = resp.StatusCode
	a.Body, err = io.ReadAll(io.LimitReader(resp.Body, maxBroadcastAnswer))
	if err != nil {
		a.Err = fmt.Errorf("read answer: %w", err)
	}
	return a
}

// Repeatable serves admin calls that Broadcast may repeat: every answer
// carries InstanceHeader, and a call this receiver repeated on itself is
// answered 204 without reaching h.
func (s *Set) Repeatable(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, s.instance)
		if r.Header.Get(OriginHeader) == s.instance {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.ServeHTTP(w, r)
	})
}
