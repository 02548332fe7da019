package storage

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestWriteHinted covers the caller-kept references (the receiver keeps them
// in the limiter's series entries): a hint reused, a stale one (the head
// dropped the series), one from before the head was truncated, one from
// another incarnation of the tenant, and one never confirmed. Every sample
// must land on its own series in all, and the DB's own cache stays empty.
func TestWriteHinted(t *testing.T) {
	db := openInternal(t)

	lsA := []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "a"}}
	lsB := []prompb.Label{{Name: "__name__", Value: "csv_succeeded"}, {Name: "name", Value: "b"}}
	t0 := time.Now().Add(-time.Hour).UnixMilli()
	hints := make([]uint64, 2)
	write := func(ts int64) {
		t.Helper()
		st, err := db.WriteHinted(context.Background(), "t", []prompb.TimeSeries{
			{Labels: lsA, Samples: []prompb.Sample{{Value: 1, Timestamp: ts}}},
			{Labels: lsB, Samples: []prompb.Sample{{Value: 2, Timestamp: ts}}},
		}, nil, hints)
		require.NoError(t, err)
		require.Equal(t, 2, st.Samples)
	}
	write(t0)
	tn := db.tenant("t")
	require.NotZero(t, hints[0])
	require.NotZero(t, hints[1])
	require.NotEqual(t, hints[0], hints[1])
	first := append([]uint64(nil), hints...)
	write(t0 + 1)
	require.Equal(t, first, hints, "an existing series keeps its hint")
	require.Zero(t, tn.refs.len(), "hinted writes leave the DB's own cache alone")

	// A hint the head does not know (as after the head dropped the series).
	hints[0] = tn.hint(tn.hintRef(first[0]) + 1_000_000)
	write(t0 + 2)
	require.Equal(t, first, hints, "the stale hint is corrected")

	// A hint of another incarnation of the tenant (before an erasure) is
	// ignored, even if its reference would be that of another series.
	hints[0] = (tn.incarnation+1)<<hintRefBits | uint64(tn.hintRef(first[1]))
	write(t0 + 3)
	require.Equal(t, first, hints)

	// The head is compacted and truncated: the series are dropped, their
	// hints go stale and are replaced.
	require.NoError(t, flushHead(tn.db, db.blockMs()))
	write(t0 + 4)
	require.NotZero(t, hints[0])

	// Every sample refused before the series is found: the hint is left as
	// it was (nothing confirmed or refuted it).
	before := hints[0]
	_, err := db.WriteHinted(context.Background(), "t", []prompb.TimeSeries{
		{Labels: lsA, Samples: []prompb.Sample{{Value: 1, Timestamp: time.Now().Add(time.Hour).UnixMilli()}}},
	}, nil, hints[:1])
	var perr *PartialError
	require.ErrorAs(t, err, &perr)
	require.Equal(t, before, hints[0])

	_, err = db.WriteHinted(context.Background(), "t", []prompb.TimeSeries{{Labels: lsA}}, nil, nil)
	require.Error(t, err, "one hint per series")

	require.Equal(t, map[string][]float64{"a": {1, 1, 1, 1, 1}, "b": {2, 2, 2, 2, 2}}, valuesByName(t, db, "t"))
}

func TestHintIncarnation(t *testing.T) {
	a := &tenant{incarnation: 5}
	b := &tenant{incarnation: 6}
	require.Zero(t, a.hint(0))
	require.Zero(t, a.hint(1<<hintRefBits), "a reference too large to tag is not hinted")
	h := a.hint(42)
	require.EqualValues(t, 42, a.hintRef(h))
	require.Zero(t, b.hintRef(h), "another incarnation's hint is ignored")
	require.Zero(t, a.hintRef(0))
}
