package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/common/model"

	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

// Write implements Writer. It creates the tenant's TSDB on first use.
//
// Resends: TSDB accepts an identical sample at a series' latest timestamp
// silently, and routes older ones through the out-of-order head, which
// drops exact timestamp duplicates of out-of-order samples and otherwise
// stores a copy that reads and compaction deduplicate. So an identical
// resend succeeds without any extra work here. A different value is only
// detected at a series' latest timestamp (ErrDuplicateSampleForTimestamp);
// TSDB does not look further back.
func (db *DB) Write(ctx context.Context, tenantName string, series []prompb.TimeSeries) (Stats, error) {
	return db.WriteWithMetadata(ctx, tenantName, series, nil)
}

// WriteWithMetadata is Write that also keeps metric metadata: meta is nil or
// has one entry per series (the zero value for none). Metadata is appended
// in the same WAL transaction as the samples, for series that exist in the
// head once their samples are appended, and served by Metadata after the
// commit. It never fails the write; it is not counted in Stats.
func (db *DB) WriteWithMetadata(ctx context.Context, tenantName string, series []prompb.TimeSeries, meta []metadata.Metadata) (Stats, error) {
	return db.write(ctx, tenantName, series, meta, nil)
}

// WriteHinted is WriteWithMetadata (meta may be nil) for a caller that keeps
// a hint per series in a structure of its own, instead of the DB's reference
// cache: the receiver keeps them in the limiter's series entries, which
// already hold one entry per series (one map and one lookup per sample
// instead of two). hints has one entry per series: 0, or what a previous
// WriteHinted of the same tenant left there for the same series (the same
// labels). A hint is the series' head reference, tagged with the tenant
// TSDB's incarnation, so one from before an erasure or a reopen is ignored; a
// stale one (the head dropped the series) makes the series be looked up by
// its labels, as a cache miss does. WriteHinted updates hints in place.
func (db *DB) WriteHinted(ctx context.Context, tenantName string, series []prompb.TimeSeries, meta []metadata.Metadata, hints []uint64) (Stats, error) {
	if len(hints) != len(series) {
		return Stats{}, fmt.Errorf("%d hints for %d series", len(hints), len(series))
	}
	return db.write(ctx, tenantName, series, meta, hints)
}

func (db *DB) write(ctx context.Context, tenantName string, series []prompb.TimeSeries, meta []metadata.Metadata, hints []uint64) (Stats, error) {
	if meta != nil && len(meta) != len(series) {
		return Stats{}, fmt.Errorf("%d metadata for %d series", len(meta), len(series))
	}
	if err := validTenant(tenantName); err != nil {
		return Stats{}, err
	}
	db.lifecycle.RLock()
	defer db.lifecycle.RUnlock()
	if db.closed {
		return Stats{}, ErrNotReady
	}
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	t, err := db.tenantForWrite(tenantName)
	if err != nil {
		return Stats{}, err
	}
	t.refs.sync(t.db.Head().MinTime())

	var (
		st            Stats
		rej           rejections
		lb            = t.refs.labelsBuilder()
		maxT          = db.now().Add(time.Duration(db.cfg.MaxFuture)).UnixMilli()
		app           = t.db.Appender(ctx)
		keepExemplars = db.cfg.MaxExemplars > 0
		// committed are the indexes of series whose metadata is appended.
		committed []int
		denied    = db.deny.checker(tenantName)
	)
	for i := range series {
		ts := &series[i]
		if denied != nil && denied(ts.Labels) {
			for range len(ts.Samples) + len(ts.Histograms) {
				rej.add(reasonErased, ErrClusterErased)
			}
			continue
		}
		sa := seriesAppender{app: app, refs: t.refs, ts: ts, lb: &lb}
		if hints != nil {
			sa.hinted = true
			sa.ref = t.hintRef(hints[i])
			sa.unconfirmed = sa.ref != 0
		} else {
			sa.lookup()
		}
		for _, s := range ts.Samples {
			if s.Timestamp > maxT {
				rej.add(reasonFuture, fmt.Errorf("sample at %d is more than %s in the future: %w", s.Timestamp, db.cfg.MaxFuture, promstorage.ErrOutOfBounds))
				continue
			}
			if err := sa.appendFloat(s); err != nil {
				if rej.refused(err) {
					continue
				}
				return Stats{}, errors.Join(fmt.Errorf("append: %w", err), app.Rollback())
			}
			st.Samples++
		}
		for _, h := range ts.Histograms {
			if h.Timestamp > maxT {
				rej.add(reasonFuture, fmt.Errorf("histogram at %d is more than %s in the future: %w", h.Timestamp, db.cfg.MaxFuture, promstorage.ErrOutOfBounds))
				continue
			}
			if err := sa.appendHistogram(h); err != nil {
				if rej.refused(err) {
					continue
				}
				return Stats{}, errors.Join(fmt.Errorf("append histogram: %w", err), app.Rollback())
			}
			st.Histograms++
		}
		if hints != nil && !sa.unconfirmed {
			// An append confirmed sa.ref, or there is none (every sample
			// refused before the series was found). An unconfirmed hint
			// stays as it was: no append tried it.
			hints[i] = t.hint(sa.ref)
		}
		if meta != nil && !isZeroMetadata(meta[i]) {
			// ref 0 (every sample refused) makes TSDB look the series up by
			// labels; a series that does not exist is not an error here.
			if _, err := app.UpdateMetadata(sa.ref, sa.labelsUnlessRef(), meta[i]); err == nil {
				committed = append(committed, i)
			}
		}
		if !keepExemplars {
			st.ExemplarsRefused += len(ts.Exemplars)
			continue
		}
		for _, e := range ts.Exemplars {
			var ex exemplar.Exemplar
			t.refs.build(func() { ex = e.ToExemplar(&lb, nil) })
			_, err := app.AppendExemplar(sa.ref, sa.labelsUnlessRef(), ex)
			switch {
			case err == nil, errors.Is(err, promstorage.ErrDuplicateExemplar):
				st.Exemplars++ // a resent exemplar is already stored
			default:
				st.ExemplarsRefused++ // never fails the write, as in Prometheus
			}
		}
	}
	if err := app.Commit(); err != nil {
		return Stats{}, fmt.Errorf("commit: %w", err)
	}
	if headCompactable(t.db.Head(), db.blockMs()) {
		db.signalCompaction() // as TSDB's Commit does (compact.go)
	}
	for _, i := range committed {
		t.meta.add(metricName(series[i].Labels), meta[i])
	}
	db.m.appendedSamples.Add(float64(st.Samples))
	db.m.appendedHistograms.Add(float64(st.Histograms))
	db.m.appendedExemplars.Add(float64(st.Exemplars))
	db.m.exemplarsRejected.Add(float64(st.ExemplarsRefused))
	for reason, n := range rej.count {
		db.m.rejected.WithLabelValues(reason).Add(float64(n))
	}
	return st, rej.err()
}

// seriesAppender appends one series' samples, by the head reference cached
// in seriesRefs when there is one, building the series' labels only when
// TSDB needs them: for a new series, or one the head no longer has.
type seriesAppender struct {
	app         promstorage.Appender
	refs        *seriesRefs
	ts          *prompb.TimeSeries
	lb          *labels.ScratchBuilder
	key         seriesKey
	ref         promstorage.SeriesRef
	ls          labels.Labels
	built       bool // ls holds the series' labels
	unconfirmed bool // ref came from the cache and no append has confirmed it yet
	hinted      bool // ref came from, and goes back to, the caller's hint (WriteHinted), not refs
}

func (a *seriesAppender) lookup() {
	a.key = a.refs.key(a.ts.Labels)
	a.ref = a.refs.get(a.key)
	a.unconfirmed = a.ref != 0
}

// labels builds the series' labels once.
func (a *seriesAppender) labels() labels.Labels {
	if !a.built {
		a.refs.build(func() { a.ls = a.ts.ToLabels(a.lb, nil) })
		a.built = true
	}
	return a.ls
}

// labelsUnlessRef returns what TSDB needs besides a.ref to find the series:
// nothing when the reference is set and confirmed. A cached reference no
// append has confirmed (every sample refused before the series lookup) may
// be stale, so it goes with the labels.
func (a *seriesAppender) labelsUnlessRef() labels.Labels {
	if a.ref != 0 && !a.unconfirmed {
		return labels.EmptyLabels()
	}
	return a.labels()
}

func (a *seriesAppender) appendFloat(s prompb.Sample) error {
	return a.append(func(ref promstorage.SeriesRef, ls labels.Labels) (promstorage.SeriesRef, error) {
		return a.app.Append(ref, ls, s.Timestamp, s.Value)
	})
}

func (a *seriesAppender) appendHistogram(h prompb.Histogram) error {
	ih, fh, err := toHistograms(h)
	if err != nil {
		return err
	}
	return a.append(func(ref promstorage.SeriesRef, ls labels.Labels) (promstorage.SeriesRef, error) {
		return a.app.AppendHistogram(ref, ls, h.Timestamp, ih, fh)
	})
}

// append runs one append. A cached reference is passed without labels, so
// if the head has dropped that series TSDB refuses it as an empty label set
// (ErrInvalidSample); the series is then looked up by its labels, and the
// cache corrected.
func (a *seriesAppender) append(do func(promstorage.SeriesRef, labels.Labels) (promstorage.SeriesRef, error)) error {
	ls := labels.EmptyLabels() // with a reference, even an unconfirmed one: the point of the cache
	if a.ref == 0 {
		ls = a.labels()
	}
	ref, err := do(a.ref, ls)
	if err != nil && a.unconfirmed && errors.Is(err, tsdb.ErrInvalidSample) {
		a.ref = 0
		ref, err = do(0, a.labels())
	}
	if err != nil {
		return err
	}
	a.unconfirmed = false
	if ref != a.ref {
		a.ref = ref
		if !a.hinted {
			a.refs.put(a.key, ref)
		}
	}
	return nil
}

func metricName(ls []prompb.Label) string {
	for _, l := range ls {
		if l.Name == model.MetricNameLabel {
			return l.Value
		}
	}
	return ""
}

// rejections collects refused samples: a count per reason and the first error.
type rejections struct {
	total int
	count map[string]int
	first map[string]error
}

func (r *rejections) add(reason string, err error) {
	if r.count == nil {
		r.count, r.first = map[string]int{}, map[string]error{}
	}
	r.total++
	r.count[reason]++
	if _, ok := r.first[reason]; !ok {
		r.first[reason] = err
	}
}

// refused classifies a TSDB append error; false means it is not a per-sample
// refusal and the whole call must fail.
func (r *rejections) refused(err error) bool {
	switch {
	case errors.Is(err, promstorage.ErrOutOfOrderSample):
		r.add(reasonOutOfOrder, err)
	case errors.Is(err, promstorage.ErrTooOldSample), errors.Is(err, promstorage.ErrOutOfBounds):
		r.add(reasonTooOld, err)
	case errors.Is(err, promstorage.ErrDuplicateSampleForTimestamp):
		r.add(reasonDuplicate, err)
	case isInvalidSample(err):
		r.add(reasonInvalid, fmt.Errorf("%w: %w", ErrInvalidSample, err))
	default:
		return false
	}
	return true
}

func (r *rejections) err() error {
	if r.total == 0 {
		return nil
	}
	errs := make([]error, 0, len(r.first))
	for _, reason := range []string{reasonOutOfOrder, reasonTooOld, reasonFuture, reasonDuplicate, reasonInvalid, reasonErased} {
		if e, ok := r.first[reason]; ok {
			errs = append(errs, e)
		}
	}
	return &PartialError{Rejected: r.total, Err: errors.Join(errs...)}
}

// isInvalidSample reports TSDB validation errors caused by the sample itself.
func isInvalidSample(err error) bool {
	var herr histogram.Error
	return errors.As(err, &herr) || errors.Is(err, tsdb.ErrInvalidSample)
}
