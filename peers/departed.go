package peers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/phonehome/phonehome/pushdown"
)

// A peer that discovery stops listing (a replica scaled down, or the old
// address of a restarted pod) uploads its head as it stops, but this
// replica reads those blocks only once its bucket view has synced after
// the upload. Dropped at once, the peer would leave its unshipped data
// missing from that view until the sync, without a warning: fleet rules
// would record and alert on the rest. Until a sync that started after it
// left has completed, reads warn that its data is missing, as for a peer
// that is down. Without a bucket view there is nothing to wait for.

// departLocked notes the peers of s.peers that next no longer holds.
// s.mu must be held.
func (s *Set) departLocked(next map[string]*peer) {
	if s.synced == nil {
		return
	}
	for a, p := range s.peers {
		if _, stays := next[a]; !stays && !p.self.Load() {
			if _, known := s.departed[a]; !known {
				s.departed[a] = s.now()
				s.logger.Info("peer left, its data is missing until the bucket has been listed since", "peer", a)
			}
		}
	}
}

// departure is a peer that left, and when.
type departure struct {
	addr string
	at   time.Time
}

// reason is why the departed peer's data is missing.
func (d departure) reason() error {
	return fmt.Errorf("it left the peers at %s, and the bucket has not been listed since", d.at.UTC().Format(time.RFC3339))
}

// err is the departed peer's warning, a down peer's.
func (d departure) err() error { return missing(d.addr, d.reason()) }

// departures returns the peers that left after the bucket view's last
// completed sync started, sorted, and forgets the others.
func (s *Set) departures() []departure {
	if s.synced == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []departure
	for a, at := range s.departed {
		if s.synced(at) {
			delete(s.departed, a)
			continue
		}
		out = append(out, departure{addr: a, at: at})
	}
	slices.SortFunc(out, func(a, b departure) int { return strings.Compare(a.addr, b.addr) })
	return out
}

// departedQuerier is a departed peer in the merge: every call fails, which
// the merge turns into a warning.
type departedQuerier struct{ d departure }

func (q departedQuerier) Select(context.Context, bool, *promstorage.SelectHints, ...*labels.Matcher) promstorage.SeriesSet {
	return promstorage.ErrSeriesSet(q.d.err())
}

func (q departedQuerier) LabelValues(context.Context, string, *promstorage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, q.d.err()
}

func (q departedQuerier) LabelNames(context.Context, *promstorage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, q.d.err()
}

func (departedQuerier) Close() error { return nil }

// departedShard is a departed peer among the pushdown shards: unavailable.
type departedShard struct{ d departure }

func (s departedShard) Name() string { return "peer " + s.d.addr }

func (s departedShard) Eval(context.Context, pushdown.Request) (*pushdown.Result, error) {
	return nil, fmt.Errorf("%w: %w", pushdown.ErrUnavailable, s.d.reason())
}
