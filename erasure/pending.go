package erasure

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/phonehome/phonehome/peers"
)

// msgRepeatDelivered is logged when a retry reaches a replica that had
// missed a call; the answer's warning tells the caller to look for it.
const msgRepeatDelivered = "admin call repeated on a replica that had missed it"

// pendingCall is an admin call taken here that a peer has not taken yet.
// Its fields other than superseded and cancel belong to its retry loop
// (or, before it starts, to repeat).
type pendingCall struct {
	path          string
	authorization string // the caller's, dropped when the call ends
	body          []byte
	tenant        string
	cluster       string // "" for a selector erasure: never superseded
	clusterSHA    string
	until         time.Time

	called  map[string]bool // the peers the first Broadcast called
	settled map[string]bool // peers that took it, refused it, or are this receiver
	waiting []string        // peers to retry, as of the last attempt
	left    map[string]bool // peers that left discovery missing it, not replaced yet
	// attempts counts the retries.
	attempts int

	superseded bool               // by a newer call for the cluster; under Repeater.mu
	cancel     context.CancelFunc // its retry loop's, once started; under Repeater.mu
	done       chan struct{}      // closed when it has ended

	// admittedBody is a cluster erasure's body with the deny off (nil for
	// other calls). A re-admission of the cluster does not supersede such
	// an erasure: the replicas that missed both must still erase, and not
	// deny. From then on (admitted, under Repeater.mu) it is sent instead.
	admittedBody []byte
	admitted     bool
	attempting   sync.Mutex // held by an attempt in flight
}

// bodyFor is what the next attempt of c sends.
func (rp *Repeater) bodyFor(c *pendingCall) []byte {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if c.admitted {
		return c.admittedBody
	}
	return c.body
}

// missing lists the peers that have not taken c, sorted.
func (c *pendingCall) missing() []string {
	out := slices.Concat(c.waiting, slices.Collect(maps.Keys(c.left)))
	slices.Sort(out)
	return slices.Compact(out)
}

// retry retries c with a capped exponential backoff until every peer has
// taken it ("delivered"), c.until passes ("expired") or ctx ends
// ("stopped": the receiver stops, or a newer call supersedes c).
func (rp *Repeater) retry(ctx context.Context, c *pendingCall) string {
	wait := repeatRetryMin
	for {
		t := time.NewTimer(min(wait, time.Until(c.until)))
		select {
		case <-ctx.Done():
			t.Stop()
			return "stopped"
		case <-t.C:
		}
		if !time.Now().Before(c.until) {
			return "expired"
		}
		if rp.attempt(ctx, c) {
			return "delivered"
		}
		if ctx.Err() != nil {
			return "stopped"
		}
		wait = min(2*wait, repeatRetryMax)
	}
}

// attempt repeats c at once on every current peer that has not taken it,
// and reports whether none is missing it any more: none left discovery
// without a newcomer taking it in its place.
func (rp *Repeater) attempt(ctx context.Context, c *pendingCall) bool {
	c.attempting.Lock()
	defer c.attempting.Unlock()
	body := rp.bodyFor(c)
	c.attempts++
	current := map[string]bool{}
	var targets []string
	for _, a := range rp.replicas.Peers() {
		current[a] = true
		if !c.settled[a] {
			targets = append(targets, a)
		}
	}
	for _, a := range c.waiting {
		if !current[a] && !c.left[a] {
			c.left[a] = true
			rp.logger.Info("replica left the peers without taking an admin call; waiting for one that joins in its place",
				"replica", a, "path", c.path, "tenant", c.tenant, "cluster_sha256", c.clusterSHA)
		}
	}
	for a := range c.left {
		if current[a] { // back: retried as itself
			delete(c.left, a)
		}
	}
	answers := make([]peers.Answer, len(targets))
	var wg sync.WaitGroup
	for i, a := range targets {
		wg.Go(func() { answers[i] = rp.replicas.Repeat(ctx, a, c.path, c.authorization, body) })
	}
	wg.Wait()
	c.waiting = nil
	for i, a := range answers {
		addr := targets[i]
		res, out := replicaResult(a)
		if out != itself && ctx.Err() == nil {
			rp.m.repeats.WithLabelValues(string(out)).Inc()
		}
		log := rp.logger.With("replica", addr, "path", c.path, "tenant", c.tenant, "cluster_sha256", c.clusterSHA, "attempts", c.attempts)
		switch out {
		case failed:
			c.waiting = append(c.waiting, addr)
			log.Debug("admin call repeat failed; retrying", "err", res.Error)
			continue
		case delivered:
			var instead string
			if !c.called[addr] && len(c.left) > 0 {
				instead = slices.Min(slices.Collect(maps.Keys(c.left)))
				delete(c.left, instead)
			}
			log.Info(msgRepeatDelivered, "job", res.Job, "in_place_of", instead)
		case refused:
			log.Warn("admin call repeat refused; not retried: send it to that replica again once that is fixed", "err", res.Error)
		}
		c.settled[addr] = true
	}
	return len(c.waiting) == 0 && len(c.left) == 0
}
