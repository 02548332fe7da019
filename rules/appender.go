package rules

import (
	"context"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	promstorage "github.com/prometheus/prometheus/storage"

	"github.com/phonehome/phonehome/storage"
)

// tenantAppendable stores a rule group's results in one tenant, through the
// same storage.Writer as ingested series: recorded series and ALERTS are
// stored (WAL, blocks, shipping) exactly like remote-written ones.
type tenantAppendable struct {
	w      storage.Writer
	tenant string
}

func (a tenantAppendable) AppenderV2(ctx context.Context) promstorage.AppenderV2 {
	return &appender{ctx: ctx, w: a.w, tenant: a.tenant}
}

// appender buffers one evaluation's samples and writes them in one call on
// Commit. Not safe for concurrent use (nor is any AppenderV2).
type appender struct {
	ctx    context.Context
	w      storage.Writer
	tenant string

	series []prompb.TimeSeries
	index  map[string]int // labels key → position in series
	buf    []byte
}

func (a *appender) Append(_ promstorage.SeriesRef, ls labels.Labels, _, t int64, v float64, h *histogram.Histogram, fh *histogram.FloatHistogram, _ promstorage.AppendV2Options) (promstorage.SeriesRef, error) {
	if a.index == nil {
		a.index = map[string]int{}
	}
	a.buf = ls.Bytes(a.buf[:0])
	i, ok := a.index[string(a.buf)]
	if !ok {
		i = len(a.series)
		a.index[string(a.buf)] = i
		a.series = append(a.series, prompb.TimeSeries{Labels: prompb.FromLabels(ls, nil)})
	}
	ts := &a.series[i]
	switch {
	case fh != nil:
		ts.Histograms = append(ts.Histograms, prompb.FromFloatHistogram(t, fh))
	case h != nil:
		ts.Histograms = append(ts.Histograms, prompb.FromIntHistogram(t, h))
	default:
		ts.Samples = append(ts.Samples, prompb.Sample{Value: v, Timestamp: t})
	}
	return promstorage.SeriesRef(i + 1), nil
}

// Commit writes the buffered samples. A partial failure (for example a
// duplicate timestamp after a restart) is returned so the rule reports it.
func (a *appender) Commit() error {
	defer a.Rollback() //nolint:errcheck // only clears the buffer
	if len(a.series) == 0 {
		return nil
	}
	_, err := a.w.Write(a.ctx, a.tenant, a.series)
	return err
}

func (a *appender) Rollback() error {
	a.series, a.index = nil, nil
	return nil
}
