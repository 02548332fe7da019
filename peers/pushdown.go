package peers

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/pushdown"
)

// Shards returns the peers (this receiver excluded) as pushdown shards:
// query parts evaluated over each peer's local data (pushdown.Path), and
// the peers that left before the bucket view synced as unavailable ones
// (departed.go).
func (s *Set) Shards() []pushdown.Shard {
	ps := s.snapshot()
	out := make([]pushdown.Shard, 0, len(ps))
	for _, p := range ps {
		out = append(out, peerShard{set: s, peer: p})
	}
	for _, d := range s.departures() {
		out = append(out, departedShard{d: d})
	}
	return out
}

// WithInstance adds InstanceHeader to h's answers, so that a receiver that
// lists itself among its peers can tell.
func (s *Set) WithInstance(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, s.instance)
		h.ServeHTTP(w, r)
	})
}

type peerShard struct {
	set  *Set
	peer *peer
}

func (s peerShard) Name() string { return "peer " + s.peer.addr }

// Eval asks the peer. Failures to reach it, and its 5xx, 401, 403 and 429,
// are pushdown.ErrUnavailable (a warning, its data missing); other answers
// (a peer without the endpoint, a query it refuses) are plain errors, which
// send the part to the merged evaluation.
func (s peerShard) Eval(ctx context.Context, req pushdown.Request) (*pushdown.Result, error) {
	id, _ := auth.FromContext(ctx)
	ctx = context.WithValue(ctx, tenantKey{}, id.Tenant)
	ctx, cancel := context.WithTimeout(ctx, time.Duration(s.set.cfg.Timeout))
	defer cancel()
	u := s.set.cfg.Scheme + "://" + s.peer.addr + pushdown.Path
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(pushdown.EncodeRequest(req).Encode()))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := s.peer.query.Do(hreq)
	if err != nil {
		return nil, s.failed(err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		err := fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
		switch c := resp.StatusCode; {
		case c/100 == 5, c == http.StatusUnauthorized, c == http.StatusForbidden, c == http.StatusTooManyRequests:
			return nil, s.failed(err)
		}
		return nil, err
	}
	res, err := pushdown.ReadResult(resp)
	if err != nil { // cut off mid-answer
		return nil, s.failed(err)
	}
	s.set.m.reads.WithLabelValues("success").Inc()
	return res, nil
}

func (s peerShard) failed(err error) error {
	s.set.m.reads.WithLabelValues("error").Inc()
	s.set.logger.Debug("peer query failed", "peer", s.peer.addr, "err", err)
	return fmt.Errorf("%w: %w", pushdown.ErrUnavailable, err)
}
