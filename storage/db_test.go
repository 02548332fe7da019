package storage_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/storagetest"
)

var discard = slog.New(slog.DiscardHandler)

func testConfig() storage.Config {
	var c storage.Config
	c.SetDefaults()
	return c
}

// openTest opens a DB on an in-memory bucket and closes it at cleanup.
func openTest(t *testing.T, dir string, cfg storage.Config, bkt objstore.Bucket, reg prometheus.Registerer) *storage.DB {
	t.Helper()
	db, err := storage.OpenWithBucket(discard, reg, dir, cfg, bkt, time.Now)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

func TestContract(t *testing.T) {
	storagetest.Run(t, func(t *testing.T) (storage.Writer, storagetest.QuerierFunc) {
		db, err := storage.Open(discard, prometheus.NewRegistry(), t.TempDir(), storage.Config{})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, db.Close()) })
		return db, db.Querier
	})
}

func TestWriteRejectsBadTenantAndAfterClose(t *testing.T) {
	db, err := storage.Open(discard, nil, t.TempDir(), storage.Config{})
	require.NoError(t, err)
	for _, name := range []string{"", ".", "..", "../x", "a/b", ".hidden", string(make([]byte, 65))} {
		_, err := db.Write(context.Background(), name, nil)
		require.ErrorIs(t, err, storage.ErrInvalidTenant, name)
	}
	require.True(t, db.Ready())
	require.NoError(t, db.Close())
	require.False(t, db.Ready())
	_, err = db.Write(context.Background(), "t", nil)
	require.ErrorIs(t, err, storage.ErrNotReady)
	_, err = db.Querier("t", 0, 1)
	require.ErrorIs(t, err, storage.ErrNotReady)
	require.NoError(t, db.Close(), "second Close is a no-op")
}

func TestWriteMetricsAndPartialError(t *testing.T) {
	reg := prometheus.NewRegistry()
	db := openTest(t, t.TempDir(), testConfig(), objstore.NewInMemBucket(), reg)
	now := time.Now().UnixMilli()
	_, err := db.Write(context.Background(), "t", []prompb.TimeSeries{
		tseries("a", now-1000, 1), tseries("b", now+time.Hour.Milliseconds(), 1), tseries("c", now-10*time.Hour.Milliseconds(), 1),
	})
	var perr *storage.PartialError
	require.ErrorAs(t, err, &perr)
	require.Equal(t, 2, perr.Rejected)
	require.ErrorIs(t, err, promstorage.ErrOutOfBounds)
	require.ErrorIs(t, err, promstorage.ErrTooOldSample)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP phonehome_storage_samples_appended_total Float samples committed to the WAL.
# TYPE phonehome_storage_samples_appended_total counter
phonehome_storage_samples_appended_total 1
# HELP phonehome_storage_samples_rejected_total Samples (floats and histograms) refused by reason.
# TYPE phonehome_storage_samples_rejected_total counter
phonehome_storage_samples_rejected_total{reason="duplicate"} 0
phonehome_storage_samples_rejected_total{reason="erased_cluster"} 0
phonehome_storage_samples_rejected_total{reason="future"} 1
phonehome_storage_samples_rejected_total{reason="invalid"} 0
phonehome_storage_samples_rejected_total{reason="out_of_order"} 0
phonehome_storage_samples_rejected_total{reason="too_old"} 1
# HELP phonehome_storage_tenants Tenants with an open TSDB.
# TYPE phonehome_storage_tenants gauge
phonehome_storage_tenants 1
`), "phonehome_storage_samples_appended_total", "phonehome_storage_samples_rejected_total", "phonehome_storage_tenants"))
	require.Equal(t, []string{"t"}, db.Tenants())

	// TSDB metrics carry the tenant label through the wrapped registerer.
	mfs, err := reg.Gather()
	require.NoError(t, err)
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "prometheus_tsdb_head_series" {
			require.Equal(t, "tenant", mf.GetMetric()[0].GetLabel()[0].GetName())
			found = true
		}
	}
	require.True(t, found)
}

func TestReopenAfterCloseAndCrash(t *testing.T) {
	now := time.Now().UnixMilli()
	in := []prompb.TimeSeries{tseries("a", now-2000, 1), tseries("a", now-1000, 2), tseries("b", now-3*time.Hour.Milliseconds(), 3)}
	want := map[string][]storagetest.Sample{
		`{__name__="a"}`: {{T: now - 2000, V: 1}, {T: now - 1000, V: 2}},
		`{__name__="b"}`: {{T: now - 3*time.Hour.Milliseconds(), V: 3}},
	}
	t.Run("after Close", func(t *testing.T) {
		dir := t.TempDir()
		db, err := storage.OpenWithBucket(discard, nil, dir, testConfig(), objstore.NewInMemBucket(), time.Now)
		require.NoError(t, err)
		_, err = db.Write(context.Background(), "t", in[:1])
		require.NoError(t, err)
		_, err = db.Write(context.Background(), "t", in[1:])
		require.NoError(t, err)
		require.NoError(t, db.Close())

		db2 := openTest(t, dir, testConfig(), objstore.NewInMemBucket(), nil)
		require.Equal(t, want, storagetest.ReadAll(t, db2.Querier, "t"))
	})
	t.Run("after crash", func(t *testing.T) {
		dir, crashed := t.TempDir(), t.TempDir()
		db := openTest(t, dir, testConfig(), objstore.NewInMemBucket(), nil)
		_, err := db.Write(context.Background(), "t", in[:1])
		require.NoError(t, err)
		_, err = db.Write(context.Background(), "t", in[1:])
		require.NoError(t, err)
		// Copy the live directory: what a SIGKILL leaves behind (acked data is
		// in the WAL files, not yet fsynced, as after a process crash).
		require.NoError(t, os.CopyFS(crashed, os.DirFS(dir)))

		db2 := openTest(t, crashed, testConfig(), objstore.NewInMemBucket(), nil)
		require.Equal(t, []string{"t"}, db2.Tenants())
		require.Equal(t, want, storagetest.ReadAll(t, db2.Querier, "t"))
	})
}

func tseries(name string, ts int64, v float64) prompb.TimeSeries {
	return prompb.TimeSeries{
		Labels:  []prompb.Label{{Name: "__name__", Value: name}},
		Samples: []prompb.Sample{{Timestamp: ts, Value: v}},
	}
}

func TestWriteExemplarsAndInvalidHistogram(t *testing.T) {
	cfg := testConfig()
	cfg.MaxExemplars = 100
	db := openTest(t, t.TempDir(), cfg, objstore.NewInMemBucket(), nil)
	now := time.Now().UnixMilli()
	s := tseries("a", now, 1)
	s.Exemplars = []prompb.Exemplar{{Labels: []prompb.Label{{Name: "trace_id", Value: "abc"}}, Value: 1, Timestamp: now}}
	bad := prompb.TimeSeries{
		Labels: []prompb.Label{{Name: "__name__", Value: "h"}},
		// Count 1 but buckets hold 3 observations: TSDB refuses it.
		Histograms: []prompb.Histogram{{
			Count: &prompb.Histogram_CountInt{CountInt: 1}, Timestamp: now,
			PositiveSpans: []prompb.BucketSpan{{Offset: 0, Length: 1}}, PositiveDeltas: []int64{3},
		}},
	}
	st, err := db.Write(context.Background(), "t", []prompb.TimeSeries{s, bad})
	require.ErrorIs(t, err, storage.ErrInvalidSample)
	require.Equal(t, storage.Stats{Samples: 1, Exemplars: 1}, st)
}

func TestConcurrentWritesAndClose(t *testing.T) {
	db, err := storage.OpenWithBucket(discard, nil, t.TempDir(), testConfig(), objstore.NewInMemBucket(), time.Now)
	require.NoError(t, err)
	now := time.Now().UnixMilli()
	errc := make(chan error, 8)
	for g := range 8 {
		go func() {
			tenant := []string{"a", "b"}[g%2]
			for i := range 200 {
				_, err := db.Write(context.Background(), tenant, []prompb.TimeSeries{tseries("m", now-int64(200-i)*1000-int64(g), float64(i))})
				if errors.Is(err, storage.ErrNotReady) {
					errc <- nil
					return
				}
				if err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	require.NoError(t, db.Close())
	for range 8 {
		require.NoError(t, <-errc)
	}
}

// Reads of a tenant without data must not keep the DB open: Close would
// wait for them forever (a peer's horizon request did, before it released).
func TestReadsOfUnknownTenantsLetCloseFinish(t *testing.T) {
	db, err := storage.Open(discard, nil, t.TempDir(), storage.Config{})
	require.NoError(t, err)
	require.Equal(t, int64(math.MinInt64), db.PeerHorizon("nobody"))
	require.Nil(t, db.LocalBlocks("nobody"))
	_, err = db.Metadata("nobody", "", 0)
	require.NoError(t, err)
	q, err := db.Querier("nobody", 0, 1)
	require.NoError(t, err)
	require.NoError(t, q.Close())

	done := make(chan error, 1)
	go func() { done <- db.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return: a read left the DB open")
	}
}

// A second process on a --storage.path in use (a receiver still running,
// a receiver erase) is told so, not only "resource temporarily
// unavailable" from the TSDB's lock.
func TestOpenNamesAStoragePathInUse(t *testing.T) {
	dir := t.TempDir()
	db, err := storage.Open(discard, nil, dir, storage.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	_, err = db.Write(context.Background(), "t", []prompb.TimeSeries{tseries("a", time.Now().UnixMilli(), 1)})
	require.NoError(t, err)

	_, err = storage.Open(discard, nil, dir, storage.Config{}) // opens the tenants on disk
	require.ErrorContains(t, err, "in use by another process")
}
