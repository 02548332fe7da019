package lifecycle

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/storage"
)

// postdate renames every block of the bucket in dir to a ULID an hour
// ahead, as a replica whose clock runs ahead names its blocks.
func postdate(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		old, err := ulid.ParseStrict(e.Name())
		require.NoError(t, err)
		id := ulid.MustNew(ulid.Timestamp(time.Now().Add(time.Hour)), ulid.DefaultEntropy())
		metaPath := filepath.Join(dir, old.String(), MetaFile)
		b, err := os.ReadFile(metaPath)
		require.NoError(t, err)
		var m storage.ThanosMeta
		require.NoError(t, json.Unmarshal(b, &m))
		m.ULID, m.Compaction.Sources = id, []ulid.ULID{id}
		b, err = json.Marshal(m)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(metaPath, b, 0o644))
		require.NoError(t, os.Rename(filepath.Join(dir, old.String()), filepath.Join(dir, id.String())))
	}
}

// TestEraseBucketCrashThenCompactionWithSkewedULIDs stops the bucket
// erasure at every write, runs the compactor's pass, then reruns the
// erasure, on blocks whose ULIDs are ahead of the erasing receiver's clock
// (their replica's clock runs ahead). A rewrite then has an older ULID
// than the block it replaces; it still replaces it: the other clusters'
// samples stay readable exactly once.
func TestEraseBucketCrashThenCompactionWithSkewedULIDs(t *testing.T) {
	golden := t.TempDir()
	want := shipBlocks(t, golden)
	postdate(t, golden)
	ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", gone)}
	cfg := storage.Config{}
	cfg.SetDefaults()
	comp := compactorConfig(2*time.Hour, 12*time.Hour)
	comp.Wait = model.Duration(48 * time.Hour) // only the pass that finishes replacements
	ctx := context.Background()

	for n := 0; ; n++ {
		dir := filepath.Join(t.TempDir(), "bucket")
		require.NoError(t, os.CopyFS(dir, os.DirFS(golden)))
		fsb, err := filesystem.NewBucket(dir)
		require.NoError(t, err)
		work := filepath.Join(t.TempDir(), "work")

		_, err = New(discard, nil, &crashingBucket{Bucket: fsb, n: n}, cfg, Options{}).EraseBucket(ctx, "acme", ms, []string{gone}, work, func(int, int) {})
		finished := err == nil
		r := New(discard, nil, fsb, cfg, Options{Compactor: comp, WorkDir: t.TempDir()})
		require.NoError(t, r.RunOnce(ctx), "after %d writes", n)
		_, err = r.EraseBucket(ctx, "acme", ms, []string{gone}, work, func(int, int) {})
		require.NoError(t, err, "rerun after %d writes", n)
		require.Equal(t, want, readable(t, dir), "after %d writes, a compaction pass and a rerun", n)
		require.Empty(t, grepFiles(t, dir, gone), "after %d writes and a rerun", n)
		if finished {
			return
		}
	}
}
