package pushdown

import (
	"context"
	"slices"
	"sync"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// synthetic serves the outer query: the parts' series by their synthetic
// names, everything else from base (the merged fleet), opened on first use.
type synthetic struct {
	parts map[string][]promstorage.Series
	base  promstorage.Queryable
}

func (s synthetic) Querier(mint, maxt int64) (promstorage.Querier, error) {
	return &syntheticQuerier{s: s, mint: mint, maxt: maxt}, nil
}

type syntheticQuerier struct {
	s          synthetic
	mint, maxt int64

	once sync.Once
	base promstorage.Querier
	err  error
}

func (q *syntheticQuerier) open() (promstorage.Querier, error) {
	q.once.Do(func() { q.base, q.err = q.s.base.Querier(q.mint, q.maxt) })
	return q.base, q.err
}

func (q *syntheticQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	for _, m := range ms {
		if m.Name != model.MetricNameLabel || m.Type != labels.MatchEqual {
			continue
		}
		if series, ok := q.s.parts[m.Value]; ok {
			// Sorted even when not asked: the engine breaks ties (topk,
			// bottomk) by input order, and the merged fleet, a merge
			// querier, yields its series in label order.
			series = slices.Clone(series)
			slices.SortFunc(series, func(a, b promstorage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
			return &listSet{series: series, i: -1}
		}
	}
	base, err := q.open()
	if err != nil {
		return promstorage.ErrSeriesSet(err)
	}
	return base.Select(ctx, sortSeries, hints, ms...)
}

func (q *syntheticQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	base, err := q.open()
	if err != nil {
		return nil, nil, err
	}
	return base.LabelValues(ctx, name, hints, ms...)
}

func (q *syntheticQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	base, err := q.open()
	if err != nil {
		return nil, nil, err
	}
	return base.LabelNames(ctx, hints, ms...)
}

func (q *syntheticQuerier) Close() error {
	if q.base != nil {
		return q.base.Close()
	}
	return nil
}

// listSet iterates a slice of series.
type listSet struct {
	series []promstorage.Series
	i      int
}

func (s *listSet) Next() bool                      { s.i++; return s.i < len(s.series) }
func (s *listSet) At() promstorage.Series          { return s.series[s.i] }
func (*listSet) Err() error                        { return nil }
func (*listSet) Warnings() annotations.Annotations { return nil }
