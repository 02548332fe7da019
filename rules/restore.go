package rules

import (
	"context"
	"errors"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// restoreQueryable gives every Select its own querier. Its one user is
// Prometheus' restore of the `for` state (ManagerOptions.Queryable), which
// selects ALERTS_FOR_STATE once per alerting rule of a group over one
// querier, iterating each set before the next Select. The fleet view is a
// merge with secondaries (peers, bucket blocks), and a merge querier
// panics on a Select after the first Next of any of its sets
// ("secondaryQuerier: Select invoked after first Next"): the evaluator
// would crash on start with two alerting rules in a group.
type restoreQueryable struct{ q promstorage.Queryable }

func (r restoreQueryable) Querier(mint, maxt int64) (promstorage.Querier, error) {
	return &perSelectQuerier{q: r.q, mint: mint, maxt: maxt}, nil
}

// perSelectQuerier opens a querier per call. Not safe for concurrent use;
// the sets it returns are valid until Close.
type perSelectQuerier struct {
	q          promstorage.Queryable
	mint, maxt int64
	opened     []promstorage.Querier
}

func (p *perSelectQuerier) open() (promstorage.Querier, error) {
	q, err := p.q.Querier(p.mint, p.maxt)
	if err != nil {
		return nil, err
	}
	p.opened = append(p.opened, q)
	return q, nil
}

func (p *perSelectQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	q, err := p.open()
	if err != nil {
		return promstorage.ErrSeriesSet(err)
	}
	return q.Select(ctx, sortSeries, hints, ms...)
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
