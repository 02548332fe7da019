package peers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/phonehome/phonehome/internal/periodic"
)

// A peer is marked unreachable by a failed call (reachability.go), so a
// replica that does not call a dead peer (no queries, no erasure repeats or
// pushes) would never notice it, and neither would its
// phonehome_peers_unreachable, which the alert watches. So every refresh
// interval each peer not already marked is asked its /-/ready, the probe of
// the marked ones: one that does not answer is marked as a failed call
// marks it, and the probe loop then asks it until it answers. Any HTTP
// answer, 503 included (a peer starting or stopping), is an answer, as for
// the probe: the peer is reachable, its reads fail on their own.

// maxConcurrentChecks bounds the peers a health check asks at once, so
// that a large fleet is not asked all together.
const maxConcurrentChecks = 8

// healthLoop checks the peers every refresh interval until ctx ends.
func (s *Set) healthLoop(ctx context.Context) {
	periodic.Every(ctx, time.Duration(s.cfg.RefreshInterval), s.checkPeers)
}

// checkPeers asks every peer that is neither this receiver nor already
// marked (the probe loop asks those) or being checked (checkHung) for its
// /-/ready, and marks those that give no answer. It returns when every
// check has ended, within the probe's timeout per maxConcurrentChecks
// peers; it holds no lock while checking.
func (s *Set) checkPeers(ctx context.Context) {
	sem := make(chan struct{}, maxConcurrentChecks)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, p := range s.snapshot() {
		if p.down.marked() || !p.checking.CompareAndSwap(false, true) {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			p.checking.Store(false)
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			defer p.checking.Store(false)
			if err := s.probe(ctx, p); err != nil {
				s.markUnreachable(p, fmt.Errorf("no answer to a health check of /-/ready: %w", err))
			}
		})
	}
}
