// Package storagetest is the contract every storage.Writer must pass, in the
// style of objstore's AcceptanceTest.
package storagetest

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/prompb"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/storage"
)

// QuerierFunc reads back what a Writer stored for one tenant.
type QuerierFunc func(tenant string, mint, maxt int64) (promstorage.Querier, error)

// Run checks the storage.Writer contract. newWriter is called once per
// subtest and must register its own cleanup. The writer must use the wall
// clock, accept at least a 2h30m out-of-order window and reject samples more
// than 1h in the future.
func Run(t *testing.T, newWriter func(t *testing.T) (storage.Writer, QuerierFunc)) {
	now := time.Now().UnixMilli()
	min := time.Minute.Milliseconds()
	ctx := context.Background()

	t.Run("read back exact samples", func(t *testing.T) {
		w, q := newWriter(t)
		in := []prompb.TimeSeries{
			series("up", samples(now-3*min, 1, now-2*min, 2, now-min, 3)),
			series("other", samples(now-min, -1.5)),
		}
		st, err := w.Write(ctx, "t1", in)
		require.NoError(t, err)
		require.Equal(t, storage.Stats{Samples: 4}, st)
		require.Equal(t, map[string][]Sample{
			`{__name__="other"}`: {{T: now - min, V: -1.5}},
			`{__name__="up"}`:    {{T: now - 3*min, V: 1}, {T: now - 2*min, V: 2}, {T: now - min, V: 3}},
		}, ReadAll(t, q, "t1"))
	})

	t.Run("stale marker is bit-exact", func(t *testing.T) {
		w, q := newWriter(t)
		stale := math.Float64frombits(value.StaleNaN)
		_, err := w.Write(ctx, "t1", []prompb.TimeSeries{series("up", samples(now-2*min, 1, now-min, stale))})
		require.NoError(t, err)
		got := ReadAll(t, q, "t1")[`{__name__="up"}`]
		require.Len(t, got, 2)
		require.Equal(t, value.StaleNaN, math.Float64bits(got[1].V))
	})

	t.Run("native histograms", func(t *testing.T) {
		w, q := newWriter(t)
		h := &histogram.Histogram{
			Count: 5, ZeroCount: 1, Sum: 12, Schema: 0, ZeroThreshold: 0.001,
			PositiveSpans: []histogram.Span{{Offset: 0, Length: 2}}, PositiveBuckets: []int64{1, 2},
		}
		fh := h.ToFloat(nil)
		in := []prompb.TimeSeries{
			{Labels: []prompb.Label{{Name: "__name__", Value: "h"}}, Histograms: []prompb.Histogram{prompb.FromIntHistogram(now-min, h)}},
			{Labels: []prompb.Label{{Name: "__name__", Value: "fh"}}, Histograms: []prompb.Histogram{prompb.FromFloatHistogram(now-min, fh)}},
		}
		st, err := w.Write(ctx, "t1", in)
		require.NoError(t, err)
		require.Equal(t, storage.Stats{Histograms: 2}, st)
		got := ReadAll(t, q, "t1")
		require.Len(t, got[`{__name__="h"}`], 1)
		require.Len(t, got[`{__name__="fh"}`], 1)
		require.True(t, h.Equals(got[`{__name__="h"}`][0].H), "%v", got[`{__name__="h"}`][0].H)
		require.True(t, fh.Equals(got[`{__name__="fh"}`][0].FH), "%v", got[`{__name__="fh"}`][0].FH)
	})

	t.Run("identical resend succeeds", func(t *testing.T) {
		w, q := newWriter(t)
		in := []prompb.TimeSeries{series("up", samples(now-3*min, 1, now-2*min, 2, now-min, 3))}
		_, err := w.Write(ctx, "t1", in)
		require.NoError(t, err)
		_, err = w.Write(ctx, "t1", in)
		require.NoError(t, err)
		// And a resend of out-of-order data, twice.
		old := []prompb.TimeSeries{series("up", samples(now-90*min, 7, now-89*min, 8))}
		for range 3 {
			_, err = w.Write(ctx, "t1", old)
			require.NoError(t, err)
		}
		require.Equal(t, []Sample{
			{T: now - 90*min, V: 7}, {T: now - 89*min, V: 8},
			{T: now - 3*min, V: 1}, {T: now - 2*min, V: 2}, {T: now - min, V: 3},
		}, ReadAll(t, q, "t1")[`{__name__="up"}`])
	})

	t.Run("2h backlog accepted while newer data exists", func(t *testing.T) {
		w, q := newWriter(t)
		_, err := w.Write(ctx, "t1", []prompb.TimeSeries{series("live", samples(now, 1))})
		require.NoError(t, err)
		backlog := samples(now-150*min, 1, now-120*min, 2, now-90*min, 3)
		st, err := w.Write(ctx, "t1", []prompb.TimeSeries{series("backlog", backlog), series("live", samples(now-125*min, 0.5))})
		require.NoError(t, err)
		require.Equal(t, 4, st.Samples)
		got := ReadAll(t, q, "t1")
		require.Len(t, got[`{__name__="backlog"}`], 3)
		require.Equal(t, []Sample{{T: now - 125*min, V: 0.5}, {T: now, V: 1}}, got[`{__name__="live"}`])
	})

	t.Run("future sample rejected, rest committed", func(t *testing.T) {
		w, q := newWriter(t)
		st, err := w.Write(ctx, "t1", []prompb.TimeSeries{
			series("up", samples(now-min, 1, now+2*time.Hour.Milliseconds(), 2)),
			series("ok", samples(now-min, 3)),
		})
		require.ErrorIs(t, err, promstorage.ErrOutOfBounds)
		require.Equal(t, 2, st.Samples)
		require.Equal(t, map[string][]Sample{
			`{__name__="ok"}`: {{T: now - min, V: 3}},
			`{__name__="up"}`: {{T: now - min, V: 1}},
		}, ReadAll(t, q, "t1"))
	})

	t.Run("different value for existing timestamp rejected, rest committed", func(t *testing.T) {
		w, q := newWriter(t)
		_, err := w.Write(ctx, "t1", []prompb.TimeSeries{series("up", samples(now-2*min, 1, now-min, 2))})
		require.NoError(t, err)
		st, err := w.Write(ctx, "t1", []prompb.TimeSeries{
			series("up", samples(now-min, 5)),
			series("ok", samples(now-min, 3)),
		})
		require.ErrorIs(t, err, promstorage.ErrDuplicateSampleForTimestamp)
		require.Equal(t, 1, st.Samples)
		require.Equal(t, map[string][]Sample{
			`{__name__="ok"}`: {{T: now - min, V: 3}},
			`{__name__="up"}`: {{T: now - 2*min, V: 1}, {T: now - min, V: 2}},
		}, ReadAll(t, q, "t1"))
	})

	t.Run("tenants are isolated", func(t *testing.T) {
		w, q := newWriter(t)
		_, err := w.Write(ctx, "a", []prompb.TimeSeries{series("up", samples(now-min, 1))})
		require.NoError(t, err)
		_, err = w.Write(ctx, "b", []prompb.TimeSeries{series("up", samples(now-min, 2))})
		require.NoError(t, err)
		require.Equal(t, map[string][]Sample{`{__name__="up"}`: {{T: now - min, V: 1}}}, ReadAll(t, q, "a"))
		require.Equal(t, map[string][]Sample{`{__name__="up"}`: {{T: now - min, V: 2}}}, ReadAll(t, q, "b"))
		require.Empty(t, ReadAll(t, q, "c"))
	})
}

// Sample is one read-back sample: a float (V) or a histogram (H or FH).
type Sample struct {
	T  int64
	V  float64
	H  *histogram.Histogram
	FH *histogram.FloatHistogram
}

// ReadAll returns every sample of a tenant, keyed by the series' labels.
func ReadAll(t testing.TB, q QuerierFunc, tenant string) map[string][]Sample {
	t.Helper()
	qr, err := q(tenant, math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	defer qr.Close()
	return ReadQuerier(t, qr)
}

// ReadQuerier returns every sample a querier holds, keyed by labels.
func ReadQuerier(t testing.TB, qr promstorage.Querier) map[string][]Sample {
	t.Helper()
	out := map[string][]Sample{}
	ss := qr.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	for ss.Next() {
		s := ss.At()
		var got []Sample
		it := s.Iterator(nil)
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			switch vt {
			case chunkenc.ValFloat:
				ts, v := it.At()
				got = append(got, Sample{T: ts, V: v})
			case chunkenc.ValHistogram:
				ts, h := it.AtHistogram(nil)
				got = append(got, Sample{T: ts, H: h})
			case chunkenc.ValFloatHistogram:
				ts, fh := it.AtFloatHistogram(nil)
				got = append(got, Sample{T: ts, FH: fh})
			}
		}
		require.NoError(t, it.Err())
		out[s.Labels().String()] = got
	}
	require.NoError(t, ss.Err())
	return out
}

// ValuesByLabel returns the float values of every series of tenant, in
// time order, grouped by the value of label.
func ValuesByLabel(t testing.TB, q QuerierFunc, tenant, label string) map[string][]float64 {
	t.Helper()
	qr, err := q(tenant, math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	defer qr.Close()
	out := map[string][]float64{}
	ss := qr.Select(context.Background(), true, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	for ss.Next() {
		k := ss.At().Labels().Get(label)
		it := ss.At().Iterator(nil)
		for it.Next() == chunkenc.ValFloat {
			_, v := it.At()
			out[k] = append(out[k], v)
		}
		require.NoError(t, it.Err())
	}
	require.NoError(t, ss.Err())
	return out
}

func series(name string, s []prompb.Sample) prompb.TimeSeries {
	return prompb.TimeSeries{Labels: []prompb.Label{{Name: "__name__", Value: name}}, Samples: s}
}

// samples builds samples from (timestamp, value) pairs.
func samples(tv ...any) []prompb.Sample {
	var out []prompb.Sample
	for i := 0; i < len(tv); i += 2 {
		out = append(out, prompb.Sample{Timestamp: toInt64(tv[i]), Value: toFloat(tv[i+1])})
	}
	return out
}

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case int:
		return int64(x)
	}
	panic("timestamp must be int64")
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case int:
		return float64(x)
	}
	panic("value must be float64 or int")
}
