package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/storagetest"
)

// recordingBucket records upload order and fails uploads while failing is set.
type recordingBucket struct {
	objstore.Bucket
	failing atomic.Bool
	mtx     sync.Mutex
	uploads []string
}

var errInjected = errors.New("injected upload failure")

func (b *recordingBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	if b.failing.Load() {
		return errInjected
	}
	b.mtx.Lock()
	b.uploads = append(b.uploads, name)
	b.mtx.Unlock()
	return b.Bucket.Upload(ctx, name, r, opts...)
}

func (b *recordingBucket) uploaded() []string {
	b.mtx.Lock()
	defer b.mtx.Unlock()
	return slices.Clone(b.uploads)
}

// writeFixture writes two tenants' data spanning several block ranges,
// including an out-of-order backlog, and returns what each tenant holds.
func writeFixture(t *testing.T, db *storage.DB) map[string]map[string][]storagetest.Sample {
	t.Helper()
	now := time.Now().UnixMilli()
	h := time.Hour.Milliseconds()
	want := map[string]map[string][]storagetest.Sample{}
	for i, tenant := range []string{"alpha", "beta"} {
		var live, backlog prompb.TimeSeries
		live.Labels = []prompb.Label{{Name: "__name__", Value: "live"}, {Name: "tenant_no", Value: string(rune('0' + i))}}
		backlog.Labels = []prompb.Label{{Name: "__name__", Value: "backlog"}}
		for ts := now - 3*h; ts <= now; ts += 10 * time.Minute.Milliseconds() {
			live.Samples = append(live.Samples, prompb.Sample{Timestamp: ts, Value: float64(ts % 1000)})
		}
		for ts := now - 5*h; ts <= now-4*h; ts += 10 * time.Minute.Milliseconds() {
			backlog.Samples = append(backlog.Samples, prompb.Sample{Timestamp: ts, Value: float64(i)})
		}
		_, err := db.Write(context.Background(), tenant, []prompb.TimeSeries{live})
		require.NoError(t, err)
		_, err = db.Write(context.Background(), tenant, []prompb.TimeSeries{backlog}) // out of order now
		require.NoError(t, err)
		want[tenant] = map[string][]storagetest.Sample{}
		for _, s := range []prompb.TimeSeries{live, backlog} {
			lb := labels.NewScratchBuilder(0)
			key := s.ToLabels(&lb, nil).String()
			for _, smp := range s.Samples {
				want[tenant][key] = append(want[tenant][key], storagetest.Sample{T: smp.Timestamp, V: smp.Value})
			}
		}
	}
	return want
}

// readBucket downloads every block, checks its meta.json and returns the
// samples per tenant (tenant taken from thanos.labels.tenant_id).
func readBucket(t *testing.T, bkt objstore.Bucket, wantLabels map[string]string) map[string]map[string][]storagetest.Sample {
	t.Helper()
	ctx := context.Background()
	got := map[string]map[string][]storagetest.Sample{}
	var ids []string
	require.NoError(t, bkt.Iter(ctx, "", func(name string) error {
		ids = append(ids, strings.TrimSuffix(name, "/"))
		return nil
	}))
	require.NotEmpty(t, ids)
	for _, id := range ids {
		_, err := ulid.Parse(id)
		require.NoError(t, err, "bucket root must hold only block dirs: %s", id)
		dir := filepath.Join(t.TempDir(), id)
		require.NoError(t, bkt.Iter(ctx, id+"/", func(name string) error {
			rc, err := bkt.Get(ctx, name)
			if err != nil {
				return err
			}
			defer rc.Close()
			dst := filepath.Join(dir, filepath.FromSlash(strings.TrimPrefix(name, id+"/")))
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			b, err := io.ReadAll(rc)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, b, 0o644)
		}, objstore.WithRecursiveIter()))

		var meta struct {
			ULID    string `json:"ulid"`
			Version int    `json:"version"`
			Thanos  struct {
				Version    int               `json:"version"`
				Labels     map[string]string `json:"labels"`
				Downsample struct {
					Resolution *int64 `json:"resolution"`
				} `json:"downsample"`
				Source       string   `json:"source"`
				SegmentFiles []string `json:"segment_files"`
				Files        []struct {
					RelPath   string `json:"rel_path"`
					SizeBytes int64  `json:"size_bytes"`
				} `json:"files"`
			} `json:"thanos"`
		}
		b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &meta))
		require.Equal(t, id, meta.ULID)
		require.Equal(t, 1, meta.Version)
		require.Equal(t, 1, meta.Thanos.Version)
		require.Equal(t, "receive", meta.Thanos.Source)
		require.NotNil(t, meta.Thanos.Downsample.Resolution)
		require.Zero(t, *meta.Thanos.Downsample.Resolution)
		tenant := meta.Thanos.Labels["tenant_id"]
		require.NotEmpty(t, tenant)
		wl := maps.Clone(wantLabels)
		wl["tenant_id"] = tenant
		require.Equal(t, wl, meta.Thanos.Labels)
		require.Equal(t, []string{"000001"}, meta.Thanos.SegmentFiles)
		var rel []string
		for _, f := range meta.Thanos.Files {
			rel = append(rel, f.RelPath)
			if f.RelPath != "meta.json" {
				st, err := os.Stat(filepath.Join(dir, f.RelPath))
				require.NoError(t, err)
				require.Equal(t, st.Size(), f.SizeBytes, f.RelPath)
			}
		}
		require.Equal(t, []string{"chunks/000001", "index", "meta.json"}, rel)

		blk, err := tsdb.OpenBlock(discard, dir, nil, nil)
		require.NoError(t, err)
		q, err := tsdb.NewBlockQuerier(blk, blk.MinTime(), blk.MaxTime())
		require.NoError(t, err)
		if got[tenant] == nil {
			got[tenant] = map[string][]storagetest.Sample{}
		}
		for k, v := range storagetest.ReadQuerier(t, q) {
			got[tenant][k] = append(got[tenant][k], v...)
		}
		require.NoError(t, q.Close())
		require.NoError(t, blk.Close())
	}
	for _, series := range got {
		for k := range series {
			slices.SortFunc(series[k], func(a, b storagetest.Sample) int { return int(a.T - b.T) })
		}
	}
	return got
}

// requireMetaLast checks that within each block meta.json was uploaded last.
func requireMetaLast(t *testing.T, uploads []string) {
	t.Helper()
	seenMeta := map[string]bool{}
	for _, u := range uploads {
		id, file, _ := strings.Cut(u, "/")
		require.False(t, seenMeta[id], "%s uploaded after meta.json", u)
		if file == "meta.json" {
			seenMeta[id] = true
		}
	}
	require.NotEmpty(t, seenMeta)
}

func TestShipperUploadsThanosBlocks(t *testing.T) {
	for name, newBkt := range map[string]func(t *testing.T) objstore.Bucket{
		"inmem": func(*testing.T) objstore.Bucket { return objstore.NewInMemBucket() },
		"filesystem": func(t *testing.T) objstore.Bucket {
			b, err := filesystem.NewBucket(t.TempDir())
			require.NoError(t, err)
			return b
		},
	} {
		t.Run(name, func(t *testing.T) {
			inner := newBkt(t)
			bkt := &recordingBucket{Bucket: inner}
			cfg := testConfig()
			cfg.ExternalLabels = map[string]string{"replica": "r1"}
			require.NoError(t, cfg.ShipInterval.Set("10ms"))
			reg := prometheus.NewRegistry()
			dir := t.TempDir()
			db := openTest(t, dir, cfg, bkt, reg)
			want := writeFixture(t, db)
			require.NoError(t, db.Flush())
			ids := append(localBlocks(t, dir, "alpha"), localBlocks(t, dir, "beta")...)
			require.NotEmpty(t, ids)

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- db.RunShipper(ctx) }()
			// Done once each upload is counted, not when its meta.json
			// appears: the shipper checks the upload after that, and a
			// cancel during the check counts a failure.
			eventually(t, func() bool {
				return counter(t, reg, "phonehome_storage_block_uploads_total", "success") == float64(len(ids))
			})
			cancel()
			require.NoError(t, <-done)

			for _, id := range ids {
				ok, err := inner.Exists(context.Background(), id+"/meta.json")
				require.NoError(t, err)
				require.True(t, ok, id)
			}
			requireMetaLast(t, bkt.uploaded())
			require.Equal(t, want, readBucket(t, inner, cfg.ExternalLabels))
			require.Zero(t, counter(t, reg, "phonehome_storage_block_uploads_total", "failure"))
			require.Zero(t, gauge(t, reg, "phonehome_storage_bucket_lag_seconds"))
		})
	}
}

func TestShipperRetriesFailedUploads(t *testing.T) {
	bkt := &recordingBucket{Bucket: objstore.NewInMemBucket()}
	bkt.failing.Store(true)
	reg := prometheus.NewRegistry()
	db := openTest(t, t.TempDir(), testConfig(), bkt, reg)
	writeFixture(t, db)
	require.NoError(t, db.Flush())

	err := db.Ship(context.Background())
	require.ErrorIs(t, err, errInjected)
	failures := counter(t, reg, "phonehome_storage_block_uploads_total", "failure")
	require.Positive(t, failures)
	require.Equal(t, failures, gauge(t, reg, "phonehome_storage_blocks_pending_upload"))
	require.Greater(t, gauge(t, reg, "phonehome_storage_bucket_lag_seconds"), 3600.0)
	require.Empty(t, bkt.uploaded())

	bkt.failing.Store(false)
	require.NoError(t, db.Ship(context.Background()))
	require.Equal(t, failures, counter(t, reg, "phonehome_storage_block_uploads_total", "success"))
	require.Zero(t, gauge(t, reg, "phonehome_storage_blocks_pending_upload"))
	require.Zero(t, gauge(t, reg, "phonehome_storage_bucket_lag_seconds"))
	requireMetaLast(t, bkt.uploaded())
}

func TestCloseFlushesAndUploads(t *testing.T) {
	dir := t.TempDir()
	inner := objstore.NewInMemBucket()
	bkt := &recordingBucket{Bucket: inner}
	db, err := storage.OpenWithBucket(discard, nil, dir, testConfig(), bkt, time.Now)
	require.NoError(t, err)
	want := writeFixture(t, db)
	require.NoError(t, db.Close())
	require.Equal(t, want, readBucket(t, inner, map[string]string{}))
	requireMetaLast(t, bkt.uploaded())

	// A block already in the bucket counts as uploaded: forget the local
	// state and ship again; nothing is re-uploaded.
	for _, tenant := range []string{"alpha", "beta"} {
		require.NoError(t, os.Remove(filepath.Join(dir, "tenants", tenant, storage.ShipperFile)))
	}
	before := len(bkt.uploaded())
	db2 := openTest(t, dir, testConfig(), bkt, nil)
	require.NoError(t, db2.Ship(context.Background()))
	require.Len(t, bkt.uploaded(), before)
	for _, tenant := range []string{"alpha", "beta"} {
		require.FileExists(t, filepath.Join(dir, "tenants", tenant, storage.ShipperFile))
	}
	// And reads after reopen still see everything, now from local blocks.
	for tenant, series := range want {
		require.Equal(t, series, storagetest.ReadAll(t, db2.Querier, tenant))
	}
}

func TestBlocksDeletedOnlyAfterUploadAndRetention(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	later := func(d time.Duration) { clock.Store(time.Now().Add(d).UnixNano()) }

	bkt := &recordingBucket{Bucket: objstore.NewInMemBucket()}
	cfg := testConfig()
	require.NoError(t, cfg.ShipInterval.Set("1s")) // also the TSDB block reload interval, where retention runs
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	db, err := storage.OpenWithBucket(discard, reg, dir, cfg, bkt, now)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	writeFixture(t, db)
	require.NoError(t, db.Flush())
	blocks := func() int { return len(localBlocks(t, dir, "alpha")) }
	n := blocks()
	require.Positive(t, n)
	waitReloads := func() {
		start := counter(t, reg, "prometheus_tsdb_reloads_total", "")
		eventually(t, func() bool { return counter(t, reg, "prometheus_tsdb_reloads_total", "") >= start+4 })
	}

	// Old but not uploaded: kept.
	later(24 * time.Hour)
	bkt.failing.Store(true)
	require.Error(t, db.Ship(context.Background()))
	waitReloads()
	require.Equal(t, n, blocks())

	// Uploaded but within retention: kept.
	later(0)
	bkt.failing.Store(false)
	require.NoError(t, db.Ship(context.Background()))
	waitReloads()
	require.Equal(t, n, blocks())

	// Uploaded and beyond retention: deleted.
	later(24 * time.Hour)
	eventually(t, func() bool { return blocks() == 0 })
}

// localBlocks lists the block ULIDs in a tenant's TSDB directory.
func localBlocks(t *testing.T, dir, tenant string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "tenants", tenant))
	require.NoError(t, err)
	var ids []string
	for _, e := range entries {
		if _, err := ulid.Parse(e.Name()); err == nil && e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// eventually polls cond until it holds or 20s pass.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met before deadline")
		}
		<-tick.C
	}
}

// counter sums a metric over series whose first label value is value ("" = all).
func counter(t *testing.T, reg *prometheus.Registry, name, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if value != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != value) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	return counter(t, reg, name, "")
}
