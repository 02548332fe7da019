package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
)

// BucketErasure reports what EraseBucket did.
type BucketErasure struct {
	// Blocks is the number of the tenant's blocks examined; Rewritten of
	// them held the series (or a forbidden string) and were replaced.
	Blocks, Rewritten int
	// Series removed, summed over blocks.
	Series int
	// Deleted counts blocks deleted at once: the rewritten ones, marked
	// blocks of the tenant still waiting for their delay, and abandoned
	// uploads holding a forbidden string.
	Deleted int
}

// EraseBucket removes the series of tenant matching ms, and every forbidden
// string (the erased cluster's id), from every block in the bucket: each
// block holding them is downloaded into workDir, rewritten without them
// (storage.RewriteBlock), the new block uploaded (meta.json last, source
// "erasure", the old block's labels, level and sources, the old block as
// its parent), then the old block is marked and deleted at once — the
// right to erasure does not wait for the deletion delay; a reader in the
// middle of a download of it gets a partial-response warning. Marked blocks
// of the tenant and marked blocks without meta.json are deleted at once too.
//
// It is idempotent and resumable: a block whose replacement is already in
// the bucket (a block with source "erasure" naming it as parent) is only
// marked and deleted. A block Thanos' compactor downsampled is rewritten
// the same way: the other series' aggregate chunks are copied byte for
// byte, and the replacement keeps the whole thanos section (its resolution
// among it) but the source. A block whose meta.json or deletion mark cannot
// be read fails the erasure before any change: it may hold the series.
// progress is called with blocks done and total.
func (r *Runner) EraseBucket(ctx context.Context, tenant string, ms []*labels.Matcher, forbidden []string, workDir string, progress func(done, total int)) (BucketErasure, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var res BucketErasure
	blocks, unreadable, err := scan(ctx, r.bkt)
	if err != nil {
		return res, err
	}
	if len(unreadable) > 0 {
		r.m.failures.WithLabelValues("read_meta").Add(float64(len(unreadable)))
		return res, joinUnreadable(unreadable)
	}
	replaced := map[ulid.ULID]bool{} // parents of erasure rewrites in the bucket
	var todo, drop, partial []block
	for _, b := range blocks {
		switch {
		case b.meta != nil && b.meta.Thanos.Source == storage.SourceErasure && b.mark == nil:
			// A marked rewrite is on its way out: its parent is
			// rewritten again rather than deleted with it.
			for _, p := range b.meta.Compaction.Parents {
				replaced[p.ULID] = true
			}
		}
		switch {
		case b.mark != nil && (b.meta == nil || b.tenant() == tenant):
			drop = append(drop, b)
		case b.meta == nil:
			partial = append(partial, b)
		case b.tenant() == tenant && b.mark == nil:
			todo = append(todo, b)
		}
	}
	for _, b := range partial {
		if b.mark != nil {
			continue
		}
		found, err := indexContains(ctx, r.bkt, b.id, forbidden)
		if err != nil {
			return res, err
		}
		if found {
			drop = append(drop, b)
		}
	}
	res.Blocks = len(todo)
	progress(0, len(todo))
	for _, b := range drop {
		del := deleteBlock
		if b.meta == nil && b.mark == nil {
			// An upload in progress may complete meanwhile: then it is a
			// block, of this tenant or not, and the rerun (a fresh scan)
			// rewrites it if it is the tenant's.
			del = deletePartial
		}
		n, err := del(ctx, r.bkt, b.id)
		r.m.deletedBytes.Add(float64(n))
		if err != nil {
			r.m.failures.WithLabelValues("erase").Inc()
			return res, err
		}
		res.Deleted++
		r.m.deleted.Inc()
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return res, err
	}
	for i, b := range todo {
		if err := r.eraseBlock(ctx, b, replaced[b.id], ms, forbidden, workDir, &res); err != nil {
			r.m.failures.WithLabelValues("erase").Inc()
			return res, fmt.Errorf("block %s: %w", b.id, err)
		}
		progress(i+1, len(todo))
	}
	return res, os.RemoveAll(workDir)
}

func (r *Runner) eraseBlock(ctx context.Context, b block, replaced bool, ms []*labels.Matcher, forbidden []string, workDir string, res *BucketErasure) error {
	if !replaced {
		src := filepath.Join(workDir, b.id.String())
		out := filepath.Join(workDir, "out")
		defer func() { _ = os.RemoveAll(src); _ = os.RemoveAll(out) }()
		// The index first: most blocks of a tenant do not hold the cluster
		// (other replicas', other times'), and their chunks are most of
		// the bytes.
		if err := os.RemoveAll(src); err != nil {
			return err
		}
		ixPath := filepath.Join(src, IndexFile)
		if err := getFile(ctx, r.bkt, path.Join(b.id.String(), IndexFile), ixPath); err != nil {
			return err
		}
		holds, err := storage.IndexHolds(ctx, ixPath, ms, forbidden)
		if err != nil {
			return err
		}
		if !holds {
			return nil
		}
		if err := download(ctx, r.bkt, b.id, src, IndexFile); err != nil {
			return err
		}
		rw, err := storage.RewriteBlock(ctx, r.logger, src, out, ms, forbidden)
		if err != nil {
			return err
		}
		if !rw.Rewritten {
			return nil
		}
		res.Rewritten++
		res.Series += rw.Series
		if rw.NewBlock != nil {
			dir := filepath.Join(out, rw.NewBlock.String())
			meta, err := readLocalMeta(dir)
			if err != nil {
				return err
			}
			// The rewrite stands for its source in Thanos' planning and
			// in readers' deduplication: same level, sources, labels and
			// resolution (a reader takes a downsampled block's rewrite for
			// raw data, and the raw blocks for replaced, without it).
			meta.Compaction.Level = b.meta.Compaction.Level
			meta.Compaction.Sources = b.meta.Compaction.Sources
			meta.Thanos = b.meta.Thanos
			meta.Thanos.Source = storage.SourceErasure
			if err := storage.UploadThanosBlock(ctx, r.bkt, dir, *meta); err != nil {
				return err
			}
		}
	}
	return r.deleteErased(ctx, b.id, "erasure", res)
}

// deleteErased marks block id and deletes it at once: the right to erasure
// does not wait for the deletion delay.
func (r *Runner) deleteErased(ctx context.Context, id ulid.ULID, details string, res *BucketErasure) error {
	if err := markForDeletion(ctx, r.bkt, id, details, r.now()); err != nil {
		return err
	}
	r.m.marked.WithLabelValues(ReasonErasure).Inc()
	n, err := deleteBlock(ctx, r.bkt, id)
	r.m.deletedBytes.Add(float64(n))
	if err != nil {
		return err
	}
	r.m.deleted.Inc()
	res.Deleted++
	return nil
}

// download copies every object of block id except its deletion mark and
// the files named in have (already there) into dir.
func download(ctx context.Context, bkt objstore.Bucket, id ulid.ULID, dir string, have ...string) error {
	return bkt.Iter(ctx, id.String(), func(name string) error {
		rel := strings.TrimPrefix(name, id.String()+"/")
		if rel == name || rel == "" || rel == DeletionMarkFile || slices.Contains(have, rel) || strings.Contains(rel, "..") {
			return nil
		}
		return getFile(ctx, bkt, name, filepath.Join(dir, filepath.FromSlash(rel)))
	}, objstore.WithRecursiveIter())
}

// getFile copies the object name into the file dst.
func getFile(ctx context.Context, bkt objstore.BucketReader, name, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	rc, err := bkt.Get(ctx, name)
	if err != nil {
		return fmt.Errorf("get %s: %w", name, err)
	}
	defer rc.Close()
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		_ = f.Close()
		return fmt.Errorf("download %s: %w", name, err)
	}
	return f.Close()
}

// indexContains reports whether block id's index object holds any of the
// strings (false when it has none).
func indexContains(ctx context.Context, bkt objstore.Bucket, id ulid.ULID, strs []string) (bool, error) {
	if len(strs) == 0 {
		return false, nil
	}
	rc, err := bkt.Get(ctx, path.Join(id.String(), IndexFile))
	if bkt.IsObjNotFoundErr(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return false, err
	}
	for _, s := range strs {
		if bytes.Contains(b, []byte(s)) {
			return true, nil
		}
	}
	return false, nil
}

func readLocalMeta(dir string) (*storage.ThanosMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return nil, err
	}
	var m storage.ThanosMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decode %s: %w", dir, err)
	}
	return &m, nil
}
