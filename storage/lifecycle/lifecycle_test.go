package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var discard = slog.New(slog.DiscardHandler)

// putBlock uploads a fake block (index, one chunk file, meta.json) of tenant
// covering [mint, maxt).
func putBlock(t *testing.T, bkt objstore.Bucket, tenant string, mint, maxt time.Time) ulid.ULID {
	t.Helper()
	ctx := context.Background()
	id := ulid.Make()
	require.NoError(t, bkt.Upload(ctx, path.Join(id.String(), "index"), bytes.NewReader(make([]byte, 100))))
	require.NoError(t, bkt.Upload(ctx, path.Join(id.String(), "chunks", "000001"), bytes.NewReader(make([]byte, 1000))))
	m := storage.ThanosMeta{BlockMeta: tsdb.BlockMeta{ULID: id, MinTime: mint.UnixMilli(), MaxTime: maxt.UnixMilli(), Version: 1}}
	m.Thanos.Labels = map[string]string{tenantLabel: tenant}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, bkt.Upload(ctx, path.Join(id.String(), MetaFile), bytes.NewReader(b)))
	return id
}

// scanOK scans bkt and requires every block to be readable.
func scanOK(t *testing.T, bkt objstore.BucketReader) []block {
	t.Helper()
	blocks, unreadable, err := scan(context.Background(), bkt)
	require.NoError(t, err)
	require.Empty(t, unreadable)
	return blocks
}

func objects(t *testing.T, bkt objstore.Bucket, id ulid.ULID) []string {
	t.Helper()
	var names []string
	require.NoError(t, bkt.Iter(context.Background(), id.String(), func(n string) error {
		names = append(names, n)
		return nil
	}, objstore.WithRecursiveIter()))
	return names
}

func marked(t *testing.T, bkt objstore.Bucket, id ulid.ULID) bool {
	t.Helper()
	ok, err := bkt.Exists(context.Background(), path.Join(id.String(), DeletionMarkFile))
	require.NoError(t, err)
	return ok
}

func TestRetentionMarksThenDeletesAfterTheDelay(t *testing.T) {
	dir := t.TempDir()
	bkt, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	ctx := context.Background()

	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := now
	d30, zero := model.Duration(30*24*time.Hour), model.Duration(0)
	cfg := storage.Config{BucketRetention: model.Duration(7 * 24 * time.Hour), Tenants: map[string]storage.TenantConfig{
		"long":    {BucketRetention: &d30},
		"forever": {BucketRetention: &zero},
	}}
	cfg.SetDefaults()
	cfg.DeletionDelay = model.Duration(time.Hour)
	require.NoError(t, cfg.Validate())
	reg := prometheus.NewRegistry()
	r := New(discard, reg, bkt, cfg, Options{Now: func() time.Time { return clock }})

	day := 24 * time.Hour
	block := func(tenant string, age time.Duration) ulid.ULID { // max time age ago
		return putBlock(t, bkt, tenant, now.Add(-age-2*time.Hour), now.Add(-age))
	}
	var (
		oldA     = block("a", 8*day)
		edgeA    = block("a", 7*day-90*time.Minute) // max time just inside retention
		newA     = block("a", day)
		oldLong  = block("long", 31*day)
		keepLong = block("long", 8*day)
		forever  = block("forever", 365*day)
	)
	require.NoError(t, r.RunOnce(ctx))
	for id, want := range map[ulid.ULID]bool{oldA: true, edgeA: false, newA: false, oldLong: true, keepLong: false, forever: false} {
		require.Equal(t, want, marked(t, bkt, id), "block %s", id)
	}
	require.Equal(t, 2.0, testutil.ToFloat64(r.m.marked.WithLabelValues(ReasonRetention)))
	// Marked blocks stay whole until the delay has passed.
	clock = now.Add(59 * time.Minute)
	require.NoError(t, r.RunOnce(ctx))
	require.Len(t, objects(t, bkt, oldA), 4)
	require.Zero(t, testutil.ToFloat64(r.m.deleted))

	clock = now.Add(time.Hour)
	require.NoError(t, r.RunOnce(ctx))
	require.Empty(t, objects(t, bkt, oldA))
	require.Empty(t, objects(t, bkt, oldLong))
	for _, id := range []ulid.ULID{edgeA, newA, keepLong, forever} {
		require.Len(t, objects(t, bkt, id), 3)
	}
	require.Equal(t, 2.0, testutil.ToFloat64(r.m.deleted))
	require.Greater(t, testutil.ToFloat64(r.m.deletedBytes), 2*1100.0)
	// The filesystem bucket leaves no empty directories behind.
	_, err = os.Stat(filepath.Join(dir, oldA.String()))
	require.ErrorIs(t, err, os.ErrNotExist)
	// edgeA falls out of retention 90 minutes later and is marked then.
	clock = now.Add(2 * time.Hour)
	require.NoError(t, r.RunOnce(ctx))
	require.True(t, marked(t, bkt, edgeA))
	require.Equal(t, 1.0, testutil.ToFloat64(r.m.runs.WithLabelValues("success"))+testutil.ToFloat64(r.m.runs.WithLabelValues("failure"))-3)
	require.Zero(t, testutil.ToFloat64(r.m.runs.WithLabelValues("failure")))
}

func TestDeletionFinishesAfterACrashHalfWay(t *testing.T) {
	bkt := objstore.NewInMemBucket()
	ctx := context.Background()
	now := time.Now()
	cfg := storage.Config{}
	cfg.SetDefaults()
	r := New(discard, nil, bkt, cfg, Options{Now: func() time.Time { return now }})
	id := putBlock(t, bkt, "a", now.Add(-4*time.Hour), now.Add(-2*time.Hour))
	require.NoError(t, markForDeletion(ctx, bkt, id, "test", now.Add(-49*time.Hour)))
	// A previous run died after deleting meta.json.
	require.NoError(t, bkt.Delete(ctx, path.Join(id.String(), MetaFile)))
	require.NoError(t, r.RunOnce(ctx))
	require.Empty(t, objects(t, bkt, id))
}

func TestAbandonedUploadsAreDeletedAfterTheDelay(t *testing.T) {
	dir := t.TempDir()
	bkt, err := filesystem.NewBucket(dir)
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Now()
	cfg := storage.Config{}
	cfg.SetDefaults()
	cfg.DeletionDelay = model.Duration(time.Hour)
	r := New(discard, nil, bkt, cfg, Options{Now: func() time.Time { return now }})

	stale, fresh := ulid.Make(), ulid.Make()
	for _, id := range []ulid.ULID{stale, fresh} {
		require.NoError(t, bkt.Upload(ctx, path.Join(id.String(), "chunks", "000001"), bytes.NewReader([]byte("x"))))
	}
	old := now.Add(-61 * time.Minute)
	require.NoError(t, os.Chtimes(filepath.Join(dir, stale.String(), "chunks", "000001"), old, old))
	live := putBlock(t, bkt, "a", now.Add(-2*time.Hour), now)

	require.NoError(t, r.RunOnce(ctx))
	require.Empty(t, objects(t, bkt, stale))
	require.Len(t, objects(t, bkt, fresh), 1, "an upload in progress is left alone")
	require.Len(t, objects(t, bkt, live), 3)
	require.Equal(t, 1.0, testutil.ToFloat64(r.m.partialDeleted))
}

func TestDeleteBlockOrder(t *testing.T) {
	bkt := &recordingBucket{Bucket: objstore.NewInMemBucket()}
	ctx := context.Background()
	id := putBlock(t, bkt, "a", time.Now().Add(-time.Hour), time.Now())
	require.NoError(t, markForDeletion(ctx, bkt, id, "", time.Now()))
	bkt.deleted = nil
	_, err := deleteBlock(ctx, bkt, id)
	require.NoError(t, err)
	require.Len(t, bkt.deleted, 4)
	require.Equal(t, path.Join(id.String(), MetaFile), bkt.deleted[0])
	require.Equal(t, path.Join(id.String(), DeletionMarkFile), bkt.deleted[3])
	require.True(t, slices.Contains(bkt.deleted, path.Join(id.String(), "index")))
}

type recordingBucket struct {
	objstore.Bucket
	deleted []string
}

func (b *recordingBucket) Delete(ctx context.Context, name string) error {
	b.deleted = append(b.deleted, name)
	return b.Bucket.Delete(ctx, name)
}
