package peers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/phonehome/phonehome/query"
)

// seriesCall asks the peer's series endpoint, with local scope and the
// tenant's credential (the peer transport), for the series of ms over the
// hints' range and, under hints.Limit, the smallest of its own: its index
// answers, and no sample is read or sent. They come back sorted, without
// samples, as the series of a series-only Select. A peer that fails is an
// error naming it (a warning of the merge); one without the endpoint, or
// an answer over maxAPIAnswer, is read over remote read instead
// (indexCallDone).
func (q *peerQuerier) seriesCall(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms []*labels.Matcher) promstorage.SeriesSet {
	callCtx, cancel := q.callContext(ctx)
	defer cancel()
	var set []labels.Labels
	env, err := callAPI(callCtx, q.set, q.peer, apiCall{
		path: query.SeriesPath, params: apiParams(hints.Start, hints.End, hints.Limit, ms),
		post:  true, // a form: a large match[] does not fit a GET's URL
		local: true,
	}, func(d *json.Decoder) error {
		var err error
		set, err = decodeSeries(d)
		return err
	})
	err = q.set.indexCallDone(ctx, q.peer, callSeries, refused(err))
	switch {
	case errors.Is(err, errNoIndexCalls):
		return q.read(ctx, sortSeries, hints, ms) // ctx: the read streams after this returns
	case err != nil:
		return promstorage.ErrSeriesSet(err)
	}
	// The merge needs them sorted and distinct; a peer is not trusted to.
	slices.SortFunc(set, labels.Compare)
	set = slices.CompactFunc(set, labels.Equal)
	if hints.Limit > 0 && len(set) > hints.Limit {
		set = set[:hints.Limit]
	}
	return &labelsOnly{set: set, ws: env.annotations(q.peer)}
}

// decodeSeries decodes the series API's data, an array of label sets,
// into labels with one symbol table for the whole answer (-tags
// dedupelabels), one label set at a time into one map: the answer is never
// held whole, nor a map per series.
func decodeSeries(d *json.Decoder) ([]labels.Labels, error) {
	tok, err := d.Token()
	if err != nil || tok == nil { // null: none
		return nil, err
	}
	if tok != json.Delim('[') {
		return nil, fmt.Errorf("series: got %v, want an array", tok)
	}
	b := labels.NewScratchBuilderWithSymbolTable(labels.NewSymbolTable(), 0)
	var (
		set []labels.Labels
		m   map[string]string
	)
	for d.More() {
		clear(m)
		if err := d.Decode(&m); err != nil {
			return nil, err
		}
		b.Reset()
		for n, v := range m {
			b.Add(n, v)
		}
		b.Sort()
		set = append(set, b.Labels())
	}
	return set, expectDelim(d, ']')
}

// labelsOnly is a series set of series without samples.
type labelsOnly struct {
	set []labels.Labels
	ws  annotations.Annotations
	cur promstorage.Series
}

func (s *labelsOnly) Next() bool {
	if len(s.set) == 0 {
		return false
	}
	s.cur = promstorage.NewListSeries(s.set[0], nil)
	s.set = s.set[1:]
	return true
}

func (s *labelsOnly) At() promstorage.Series            { return s.cur }
func (*labelsOnly) Err() error                          { return nil }
func (s *labelsOnly) Warnings() annotations.Annotations { return s.ws }
