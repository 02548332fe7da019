package storage_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
)

func TestMetadata(t *testing.T) {
	now := time.Now().UnixMilli()
	reqs := []prompb.TimeSeries{
		tseries("http_requests_total", now, 1),
		tseries("rpc_duration_seconds_bucket", now, 2), // classic histogram: family without suffix
		tseries("rpc_duration_seconds_count", now, 2),
		tseries("no_meta", now, 3),
		tseries("refused", now+time.Hour.Milliseconds(), 4), // too far in the future: nothing stored
	}
	counter := metadata.Metadata{Type: model.MetricTypeCounter, Help: "Requests.", Unit: ""}
	hist := metadata.Metadata{Type: model.MetricTypeHistogram, Help: "RPC latency.", Unit: "seconds"}
	meta := []metadata.Metadata{counter, hist, hist, {}, {Type: model.MetricTypeGauge, Help: "never stored"}}
	want := map[string][]metadata.Metadata{
		"http_requests_total":  {counter},
		"rpc_duration_seconds": {hist},
	}

	check := func(t *testing.T, db *storage.DB) {
		t.Helper()
		got, err := db.Metadata("t", "", -1)
		require.NoError(t, err)
		require.Equal(t, want, got)
		got, err = db.Metadata("t", "rpc_duration_seconds", -1)
		require.NoError(t, err)
		require.Equal(t, map[string][]metadata.Metadata{"rpc_duration_seconds": {hist}}, got)
		got, err = db.Metadata("t", "", 1)
		require.NoError(t, err)
		require.Len(t, got, 1)
		got, err = db.Metadata("other", "", -1)
		require.NoError(t, err)
		require.Empty(t, got, "tenant-scoped")
	}

	write := func(t *testing.T, db *storage.DB) {
		t.Helper()
		st, err := db.WriteWithMetadata(context.Background(), "t", reqs, meta)
		var perr *storage.PartialError
		require.ErrorAs(t, err, &perr)
		require.Equal(t, storage.Stats{Samples: 4}, st)
		// A second help text for the same family is kept alongside; a resend is not duplicated.
		_, err = db.WriteWithMetadata(context.Background(), "t", reqs[:1], []metadata.Metadata{counter})
		require.NoError(t, err)
	}

	t.Run("after Close (head flushed, WAL truncated)", func(t *testing.T) {
		dir := t.TempDir()
		db, err := storage.OpenWithBucket(discard, nil, dir, testConfig(), objstore.NewInMemBucket(), time.Now)
		require.NoError(t, err)
		write(t, db)
		check(t, db)
		require.NoError(t, db.Close())
		check2 := openTest(t, dir, testConfig(), objstore.NewInMemBucket(), nil)
		check(t, check2)
	})
	t.Run("after crash (WAL only)", func(t *testing.T) {
		dir, crashed := t.TempDir(), t.TempDir()
		db := openTest(t, dir, testConfig(), objstore.NewInMemBucket(), nil)
		write(t, db)
		require.NoError(t, os.CopyFS(crashed, os.DirFS(dir)))
		check(t, openTest(t, crashed, testConfig(), objstore.NewInMemBucket(), nil))
	})
	t.Run("mismatched lengths", func(t *testing.T) {
		db := openTest(t, t.TempDir(), testConfig(), objstore.NewInMemBucket(), nil)
		_, err := db.WriteWithMetadata(context.Background(), "t", reqs, meta[:1])
		require.Error(t, err)
	})
}

func TestWriteFamilyMetadataSurvivesRestart(t *testing.T) {
	dir, bkt := t.TempDir(), objstore.NewInMemBucket()
	db := openTest(t, dir, testConfig(), bkt, nil)
	require.NoError(t, db.WriteFamilyMetadata("t", []prompb.MetricMetadata{
		{MetricFamilyName: "up", Type: prompb.MetricMetadata_GAUGE, Help: "Target is up."},
		{MetricFamilyName: "", Type: prompb.MetricMetadata_COUNTER}, // ignored
	}))
	require.ErrorIs(t, db.WriteFamilyMetadata("../x", nil), storage.ErrInvalidTenant)
	want := map[string][]metadata.Metadata{"up": {{Type: model.MetricTypeGauge, Help: "Target is up."}}}
	got, err := db.Metadata("t", "", -1)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.NoError(t, db.Close())

	db = openTest(t, dir, testConfig(), bkt, nil)
	got, err = db.Metadata("t", "", -1)
	require.NoError(t, err)
	require.Equal(t, want, got, "saved at Close, read back at open")
}
