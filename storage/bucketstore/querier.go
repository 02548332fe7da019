package bucketstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/annotations"
)

// maxQueryDownloads bounds the parallel downloads of one query.
const maxQueryDownloads = 4

// Queriers returns one querier per bucket block of tenant overlapping
// [mint, maxt], skipping the blocks in skip (copies the caller has locally).
//
// Nothing is downloaded here: Prometheus' Queryable.Querier has no context
// to bound a download by. The first call on any of the queriers (Select,
// LabelValues, LabelNames) downloads the missing blocks of all of them, at
// most 4 at a time, and waits only as long as that call's context allows.
// A block that cannot be fetched, or whose download the context ended
// before, makes its querier's calls fail; a merge querier that holds it as
// a secondary turns that into a warning. (The engine then fails a query
// whose context ended with its own timeout or cancellation error.) A later
// call with a live context waits again; a download error is final for these
// queriers.
//
// The queriers of one call are safe for concurrent use. Every returned
// querier must be closed; a block is not evicted while one of its queriers
// is open.
func (s *Store) Queriers(tenant string, mint, maxt int64, skip []ulid.ULID) []promstorage.Querier {
	skipSet := make(map[ulid.ULID]struct{}, len(skip))
	for _, id := range skip {
		skipSet[id] = struct{}{}
	}
	s.mu.Lock()
	metas := s.selectLocked(tenant, mint, maxt, skipSet)
	s.mu.Unlock()
	if len(metas) == 0 {
		return nil
	}
	set := &blockSet{s: s, mint: mint, maxt: maxt, lock: make(chan struct{}, 1)}
	qs := make([]promstorage.Querier, len(metas))
	for i, m := range metas {
		b := &lazyBlock{set: set, id: m.ULID}
		set.blocks = append(set.blocks, b)
		qs[i] = b
	}
	return qs
}

// blockSet is the bucket blocks of one query, opened together on first use:
// a merge querier calls its label methods on one querier after the other,
// so opening each block on its own first call would download one at a time.
type blockSet struct {
	s          *Store
	mint, maxt int64
	// lock guards the state of blocks. It is a channel so that waiting for
	// it ends with the caller's context.
	lock   chan struct{}
	blocks []*lazyBlock
}

// lazyBlock is the querier of one block of a blockSet. Its fields other
// than set and id are guarded by set.lock.
type lazyBlock struct {
	set *blockSet
	id  ulid.ULID
	e   *entry              // pinned while q is open
	q   promstorage.Querier // nil until open
	err error               // the block could not be opened, for good
}

// querier returns b's open querier, opening every block of the set not yet
// open as long as ctx allows.
func (b *lazyBlock) querier(ctx context.Context) (promstorage.Querier, error) {
	select {
	case b.set.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("bucket block %s: %w", b.id, waitErr(ctx))
	}
	defer func() { <-b.set.lock }()
	b.set.openLocked(ctx)
	switch {
	case b.q != nil:
		return b.q, nil
	case b.err != nil:
		return nil, fmt.Errorf("bucket block %s: %w", b.id, b.err)
	default:
		return nil, fmt.Errorf("bucket block %s: %w", b.id, waitErr(ctx))
	}
}

// openLocked opens the blocks not yet open, maxQueryDownloads at a time,
// until ctx ends.
func (bs *blockSet) openLocked(ctx context.Context) {
	var pending []*lazyBlock
	for _, b := range bs.blocks {
		if b.q == nil && b.err == nil {
			pending = append(pending, b)
		}
	}
	work := make(chan *lazyBlock)
	var wg sync.WaitGroup
	for range min(maxQueryDownloads, len(pending)) {
		wg.Go(func() {
			for b := range work {
				if ctx.Err() == nil {
					b.open(ctx)
				}
			}
		})
	}
	for _, b := range pending {
		work <- b
	}
	close(work)
	wg.Wait()
}

// open pins and opens b's block. It leaves b unopened, to be tried again,
// if ctx ended first.
func (b *lazyBlock) open(ctx context.Context) {
	s := b.set.s
	e, err := s.acquire(ctx, b.id)
	if err != nil {
		if ctx.Err() == nil {
			b.err = err
		}
		return
	}
	q, err := tsdb.NewBlockQuerier(e.block, b.set.mint, b.set.maxt)
	if err != nil {
		s.release(e)
		b.err = err
		return
	}
	b.e, b.q = e, q
}

func (b *lazyBlock) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	q, err := b.querier(ctx)
	if err != nil {
		return promstorage.ErrSeriesSet(err)
	}
	return q.Select(ctx, sortSeries, hints, ms...)
}

func (b *lazyBlock) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := b.querier(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q.LabelValues(ctx, name, hints, ms...)
}

func (b *lazyBlock) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := b.querier(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q.LabelNames(ctx, hints, ms...)
}

// errQuerierClosed keeps a closed block from being opened again when
// another querier of its set is used.
var errQuerierClosed = errors.New("querier closed")

// Close closes the block's querier, if open, and unpins the block.
func (b *lazyBlock) Close() error {
	b.set.lock <- struct{}{}
	defer func() { <-b.set.lock }()
	q, e := b.q, b.e
	b.q, b.e, b.err = nil, nil, errQuerierClosed
	if q == nil {
		return nil
	}
	err := q.Close()
	b.set.s.release(e)
	return err
}
