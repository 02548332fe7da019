package storage_test

import (
	"bytes"
	"context"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
)

// grepDir returns the files under dir containing needle.
func grepDir(t *testing.T, dir string, needle []byte) []string {
	t.Helper()
	var hits []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(b, needle) {
			hits = append(hits, p)
		}
		return nil
	}))
	return hits
}

func countByCluster(t *testing.T, db *storage.DB, tenant string) map[string]int {
	t.Helper()
	q, err := db.Querier(tenant, math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	defer q.Close()
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	out := map[string]int{}
	for ss.Next() {
		it := ss.At().Iterator(nil)
		for it.Next() != 0 {
			out[ss.At().Labels().Get("_id")]++
		}
	}
	require.NoError(t, ss.Err())
	return out
}

func TestEraseLocalLeavesNoByteOfTheCluster(t *testing.T) {
	const gone = "c0ffee-erase-me-7f3a9b"
	dir := t.TempDir()
	bkt := objstore.NewInMemBucket()
	reg := prometheus.NewRegistry()
	db := openTest(t, dir, testConfig(), bkt, reg)
	ctx := context.Background()
	now := time.Now()
	write := func(at time.Time, clusters ...string) {
		t.Helper()
		var ss []prompb.TimeSeries
		for _, c := range clusters {
			ss = append(ss, prompb.TimeSeries{
				Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: c}, {Name: "job", Value: "j"}},
				Samples: []prompb.Sample{{Timestamp: at.UnixMilli(), Value: 1}},
			})
		}
		_, err := db.Write(ctx, "acme", ss)
		require.NoError(t, err)
	}
	// An uploaded block, a block not yet uploaded, the head, and the
	// out-of-order head, each holding both clusters.
	write(now.Add(-5*time.Hour), gone, "keep")
	require.NoError(t, db.Flush())
	require.NoError(t, db.Ship(ctx))
	write(now.Add(-3*time.Hour), gone, "keep")
	require.NoError(t, db.Flush())
	write(now.Add(-time.Minute), gone, "keep")
	write(now.Add(-30*time.Minute), gone, "keep")
	require.Equal(t, map[string]int{gone: 4, "keep": 4}, countByCluster(t, db, "acme"))
	require.NotEmpty(t, grepDir(t, filepath.Join(dir, "tenants", "acme"), []byte(gone)))

	erase := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", gone)}
	res, err := db.EraseLocal(ctx, "acme", erase, []string{gone})
	require.NoError(t, err)
	require.Positive(t, res.Series)
	require.Equal(t, 1, res.BlocksDropped, "the uploaded block's local copy")
	require.Empty(t, grepDir(t, dir, []byte(gone)))
	// The uploaded block's data is in the bucket, not local any more.
	require.Equal(t, map[string]int{"keep": 3}, countByCluster(t, db, "acme"))

	// The tenant works as before: writes, shipping, metrics re-registered.
	write(now, "keep")
	require.NoError(t, db.Ship(ctx))
	_, err = reg.Gather()
	require.NoError(t, err)

	// Idempotent.
	res, err = db.EraseLocal(ctx, "acme", erase, []string{gone})
	require.NoError(t, err)
	require.Zero(t, res.Series)
}

func TestDenyRefusesErasedClusterUntilReadmitted(t *testing.T) {
	const gone = "c0ffee-erase-me-7f3a9b"
	dir := t.TempDir()
	db, err := storage.OpenWithBucket(discard, nil, dir, testConfig(), objstore.NewInMemBucket(), time.Now)
	require.NoError(t, err)
	ctx := context.Background()
	ts := func(c string) prompb.TimeSeries {
		return prompb.TimeSeries{
			Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: c}},
			Samples: []prompb.Sample{{Timestamp: time.Now().UnixMilli(), Value: 1}, {Timestamp: time.Now().UnixMilli() + 1, Value: 1}},
		}
	}
	require.NoError(t, db.Deny("acme", gone, "ticket 42"))
	st, err := db.Write(ctx, "acme", []prompb.TimeSeries{ts(gone), ts("keep")})
	require.ErrorIs(t, err, storage.ErrClusterErased)
	require.ErrorIs(t, err, storage.ErrInvalidSample)
	var perr *storage.PartialError
	require.ErrorAs(t, err, &perr)
	require.Equal(t, 2, perr.Rejected)
	require.Equal(t, 2, st.Samples)
	// Other tenants are not affected.
	_, err = db.Write(ctx, "other", []prompb.TimeSeries{ts(gone)})
	require.NoError(t, err)
	require.NoError(t, db.Close())

	// Persisted, by digest only.
	require.Empty(t, grepDir(t, filepath.Join(dir, "tenants", "acme"), []byte(gone)))
	b, err := os.ReadFile(filepath.Join(dir, "erased-clusters.json"))
	require.NoError(t, err)
	require.NotContains(t, string(b), gone)
	require.Contains(t, string(b), storage.ClusterDigest("acme", gone))
	db, err = storage.OpenWithBucket(discard, nil, dir, testConfig(), objstore.NewInMemBucket(), time.Now)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	require.True(t, db.Denied("acme", gone))
	ok, err := db.Readmit("acme", gone)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = db.Write(ctx, "acme", []prompb.TimeSeries{ts(gone)})
	require.NoError(t, err)
}
