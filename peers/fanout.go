package peers

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// fleetQuerier is the merge of this receiver's querier and its peers' for
// Select and Close (promstorage.NewMergeQuerier, which asks them all at
// once), and asks them all at once for label calls too: the merge querier
// asks one after another, so a label call took the sum of the peers'
// latencies rather than the slowest's.
type fleetQuerier struct {
	promstorage.Querier // the merge
	inner               promstorage.Querier
	peers               []*peerQuerier
	departed            []error // peers gone before the bucket view synced: warnings
}

func (q fleetQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return q.fanOut(ctx, hints, func(ctx context.Context, lq promstorage.LabelQuerier) ([]string, annotations.Annotations, error) {
		return lq.LabelValues(ctx, name, hints, ms...)
	})
}

func (q fleetQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return q.fanOut(ctx, hints, func(ctx context.Context, lq promstorage.LabelQuerier) ([]string, annotations.Annotations, error) {
		return lq.LabelNames(ctx, hints, ms...)
	})
}

// Select is the merge's, with its warnings known before the first Next:
// Prometheus' series API reads them before it iterates, when the merge's,
// lazy, are none yet, so that a peer that failed was no warning there.
func (q fleetQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	return &warnedFirst{SeriesSet: q.Querier.Select(ctx, sortSeries, hints, ms...)}
}

// warnedFirst is a series set whose Warnings, asked before the first
// Next, make that first Next (and keep its result for it).
type warnedFirst struct {
	promstorage.SeriesSet
	started bool
	primed  bool // the first Next was made by Warnings
	next    bool // and returned this
}

func (s *warnedFirst) Next() bool {
	if s.primed {
		s.primed = false
		return s.next
	}
	s.started = true
	return s.SeriesSet.Next()
}

func (s *warnedFirst) Warnings() annotations.Annotations {
	if !s.started {
		s.started, s.primed = true, true
		s.next = s.SeriesSet.Next()
	}
	return s.SeriesSet.Warnings()
}

// labelAnswer is one querier's answer to a label call.
type labelAnswer struct {
	vals []string
	ws   annotations.Annotations
	err  error
}

// fanOut makes call on the inner querier and on every peer at once, one
// goroutine per peer (peers are few), all ended before it returns. The
// inner querier's error fails the call and cancels the peers'; a peer's is
// a warning and its values are missing. The answers are merged whatever
// order they arrived in: the union, sorted, cut at hints.Limit (each is
// the smallest of its own under a limit, query.LimitSmallest, so the cut
// is the smallest of the union).
func (q fleetQuerier) fanOut(ctx context.Context, hints *promstorage.LabelHints,
	call func(context.Context, promstorage.LabelQuerier) ([]string, annotations.Annotations, error),
) ([]string, annotations.Annotations, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers := make([]labelAnswer, len(q.peers))
	var wg sync.WaitGroup
	for i, p := range q.peers {
		wg.Go(func() {
			a := &answers[i]
			a.vals, a.ws, a.err = call(ctx, p)
		})
	}
	own := labelAnswer{}
	own.vals, own.ws, own.err = call(ctx, q.inner)
	if own.err != nil {
		cancel()
	}
	wg.Wait()
	if own.err != nil {
		return nil, own.ws, own.err
	}
	// A querier's answer, values and warnings, is not ours to add to.
	vals, ws := slices.Clone(own.vals), maps.Clone(own.ws)
	for _, err := range q.departed {
		ws.Add(err)
	}
	for _, a := range answers {
		ws.Merge(a.ws)
		if a.err != nil {
			ws.Add(a.err)
			continue
		}
		vals = append(vals, a.vals...)
	}
	slices.Sort(vals)
	vals = slices.Compact(vals)
	if hints != nil && hints.Limit > 0 && len(vals) > hints.Limit {
		vals = vals[:hints.Limit]
	}
	return vals, ws, nil
}
