package rules

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/phonehome/phonehome/query"
)

// restoreReads bounds the reads of a group's `for` state when they get
// partial data (see perSelectQuerier.Select).
const restoreReads = 3

// restoreQueryable serves Prometheus' restore of the `for` state
// (ManagerOptions.Queryable), its one user, which selects
// ALERTS_FOR_STATE once per alerting rule of a group over one querier,
// after the group's second evaluation.
//
// It gives every Select its own querier: the fleet view is a merge with
// secondaries (peers, bucket blocks), a merge querier panics on a Select
// after the first Next of any of its sets ("secondaryQuerier: Select
// invoked after first Next"), and the restore iterates each set before the
// next Select: the evaluator would crash on start with two alerting rules
// in a group.
//
// And it reads each answer in full before the restore sees it, so that an
// answer lacking data (query.MissingData) is read again or refused
// instead of restoring from it (perSelectQuerier.Select).
type restoreQueryable struct {
	q promstorage.Queryable
	// stop ends the waits between reads (the manager's Run context: the
	// groups' own never ends).
	stop context.Context
	// retryWait is the wait before the second read, doubled before each
	// later one, so a group's restore waits 3×retryWait at most.
	retryWait time.Duration
	partial   *prometheus.CounterVec // by result: retried, failed
	// holdAlerts reports whether the rule selected by ms may hold alerts;
	// nil: always.
	holdAlerts func(ms []*labels.Matcher) bool
}

func (r restoreQueryable) Querier(mint, maxt int64) (promstorage.Querier, error) {
	return &perSelectQuerier{r: r, mint: mint, maxt: maxt, reads: restoreReads}, nil
}

// perSelectQuerier opens a querier per read. Not safe for concurrent use;
// the sets it returns are valid until Close.
type perSelectQuerier struct {
	r          restoreQueryable
	mint, maxt int64
	opened     []promstorage.Querier
	reads      int // left for a Select that gets partial data; shared, so the group's restore waits a bounded time
	wait       time.Duration
}

func (p *perSelectQuerier) open() (promstorage.Querier, error) {
	q, err := p.r.q.Querier(p.mint, p.maxt)
	if err != nil {
		return nil, err
	}
	p.opened = append(p.opened, q)
	return q, nil
}

// Select reads a rule's `for` state. An answer lacking data (a peer
// unavailable, a bucket block not fetched) is read again after a wait, up
// to restoreReads reads for the whole group; if it still lacks data, the
// Select fails. Unless the rule holds no alert: then there is nothing the
// answer could restore (as at a start while peers are not ready, when the
// evaluations skipped the rules too), and it is used as it is. Restored from what it got, an alert could fire before its
// `for` has passed (the missing part may hold its latest activation) or
// lose the state of an alert that was firing, both silently. Failed, it is
// Prometheus' failed restore: the group logs it ("Failed to restore 'for'
// state", at error) and the rule's alerts wait their full `for` from the
// start, never less.
func (p *perSelectQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	for {
		set, err := p.read(ctx, sortSeries, hints, ms...)
		if !errors.Is(err, query.ErrPartialData) {
			if err != nil {
				return promstorage.ErrSeriesSet(err)
			}
			return set
		}
		if p.r.holdAlerts != nil && !p.r.holdAlerts(ms) {
			return promstorage.EmptySeriesSet() // what it read cannot apply to any alert
		}
		p.reads--
		if p.reads <= 0 || !p.sleep() {
			p.reads = 0 // later rules of the group read once, without waiting
			p.r.partial.WithLabelValues("failed").Inc()
			return promstorage.ErrSeriesSet(fmt.Errorf("`for` state not restored, the alerts wait their full `for`: %w", err))
		}
		p.r.partial.WithLabelValues("retried").Inc()
	}
}

// read selects through a querier of its own and reads the whole answer, so
// that what its warnings say is known before any of it is used.
func (p *perSelectQuerier) read(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) (promstorage.SeriesSet, error) {
	q, err := p.open()
	if err != nil {
		return nil, err
	}
	ss := q.Select(ctx, sortSeries, hints, ms...)
	read := &readSet{}
	for ss.Next() {
		s := ss.At()
		samples, err := promstorage.ExpandSamplesWithoutReplacingNaNs(s.Iterator(nil), nil) // stale markers end an alert
		if err != nil {
			return nil, err
		}
		read.series = append(read.series, promstorage.NewListSeries(s.Labels(), samples))
	}
	if err := ss.Err(); err != nil {
		return nil, err
	}
	if err := query.MissingData(ss.Warnings()); err != nil {
		return nil, err
	}
	return read, nil
}

// sleep waits before the next read, and reports false if the manager
// stopped meanwhile.
func (p *perSelectQuerier) sleep() bool {
	if p.wait == 0 {
		p.wait = p.r.retryWait
	} else {
		p.wait *= 2
	}
	t := time.NewTimer(p.wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.r.stop.Done():
		return false
	}
}

func (p *perSelectQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := p.open()
	if err != nil {
		return nil, nil, err
	}
	return q.LabelValues(ctx, name, hints, ms...)
}

func (p *perSelectQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q, err := p.open()
	if err != nil {
		return nil, nil, err
	}
	return q.LabelNames(ctx, hints, ms...)
}

func (p *perSelectQuerier) Close() error {
	var errs []error
	for _, q := range p.opened {
		errs = append(errs, q.Close())
	}
	p.opened = nil
	return errors.Join(errs...)
}

// readSet is an answer read in full; its series' labels stay valid until
// the querier that read them closes.
type readSet struct {
	series []promstorage.Series
	cur    promstorage.Series
}

func (s *readSet) Next() bool {
	if len(s.series) == 0 {
		return false
	}
	s.cur, s.series = s.series[0], s.series[1:]
	return true
}

func (s *readSet) At() promstorage.Series          { return s.cur }
func (*readSet) Err() error                        { return nil }
func (*readSet) Warnings() annotations.Annotations { return nil }
