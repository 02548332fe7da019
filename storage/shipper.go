package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
)

// RunShipper uploads blocks at once, then every ship_interval ± 10 % until
// ctx is done, then returns nil. Errors of a round are logged and the blocks
// retried next round. The jitter keeps replicas restarted together (a
// rollout) from listing and uploading to the shared bucket in lockstep.
func (db *DB) RunShipper(ctx context.Context) error {
	for {
		if err := db.ship(ctx); err != nil && ctx.Err() == nil {
			db.logger.Warn("block upload failed, will retry", "err", err)
		}
		t := time.NewTimer(jittered(time.Duration(db.cfg.ShipInterval)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// jittered returns d ± 10 %, uniformly distributed: the wait of a periodic
// loop that talks to a service shared by every replica (the bucket).
func jittered(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
}

func (db *DB) ship(ctx context.Context) error {
	db.shipMtx.Lock()
	defer db.shipMtx.Unlock()
	if db.shipClosed {
		return nil
	}
	return db.shipLocked(ctx)
}

// HoldShipping makes every ship round, the one at shutdown included, upload
// none of a tenant's blocks while held(tenant) is true. The receiver passes
// erasure.Eraser.ShippingHeld: an erasure whose local step has not finished
// may have flushed the cluster's series into local blocks (tombstoned, not
// yet rewritten), and those must not reach the bucket. held is called
// during ship rounds, with the ship lock held: it must not call the DB.
func (db *DB) HoldShipping(held func(tenant string) bool) {
	db.shipMtx.Lock()
	defer db.shipMtx.Unlock()
	db.shipHold = held
}

// shipLocked runs one round over all tenants. db.shipMtx must be held.
// Blocks of a held tenant count as pending (and in the bucket lag), and in
// phonehome_storage_blocks_held_by_erasure.
func (db *DB) shipLocked(ctx context.Context) error {
	var (
		errs          []error
		pending, held int
		oldest        int64 = -1 // max time of the oldest pending block
	)
	notUploaded := func(meta tsdb.BlockMeta) {
		pending++
		if oldest < 0 || meta.MaxTime < oldest {
			oldest = meta.MaxTime
		}
	}
	for _, t := range db.snapshotTenants() {
		if err := t.meta.save(t.dir); err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", t.name, err))
		}
		hold := db.shipHold != nil && db.shipHold(t.name)
		blocks := t.db.Blocks()
		local := make([]ulid.ULID, 0, len(blocks))
		for _, b := range blocks {
			local = append(local, b.Meta().ULID)
		}
		for _, b := range blocks {
			meta := b.Meta()
			switch {
			case t.isUploaded(meta.ULID):
				continue
			case hold:
				held++
				notUploaded(meta)
				continue
			}
			if err := db.uploadBlock(ctx, t, b.Dir(), meta); err != nil {
				db.m.uploads.WithLabelValues("failure").Inc()
				errs = append(errs, fmt.Errorf("tenant %s block %s: %w", t.name, meta.ULID, err))
				notUploaded(meta)
				continue
			}
			db.m.uploads.WithLabelValues("success").Inc()
			if err := t.markUploaded(meta.ULID, local); err != nil {
				errs = append(errs, fmt.Errorf("tenant %s: %w", t.name, err))
			}
		}
		if hold {
			db.logger.Debug("shipping held until the tenant's erasure has erased the local storage", "tenant", t.name)
		}
	}
	db.m.pendingBlocks.Set(float64(pending))
	db.m.heldBlocks.Set(float64(held))
	if oldest < 0 {
		db.m.bucketLag.Set(0)
	} else {
		db.m.bucketLag.Set(max(0, db.now().Sub(time.UnixMilli(oldest)).Seconds()))
	}
	return errors.Join(errs...)
}

// uploadBlock uploads chunks and index, then meta.json last, so readers never
// see a partial block. A block already complete in the bucket is not
// uploaded again. The upload is checked afterwards: the bucket's lifecycle
// deletes uploads without meta.json (an erasure at once, when their index
// holds the erased id), and a deletion racing this upload would leave a
// meta.json over missing objects. Taking that for shipped would make the
// broken copy the only one once the local block ages out; an error keeps
// the block local, and the next round uploads it again.
func (db *DB) uploadBlock(ctx context.Context, t *tenant, dir string, meta tsdb.BlockMeta) error {
	ok, err := db.inBucket(ctx, meta.ULID)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	labels := maps.Clone(db.cfg.ExternalLabels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[tenantLabel] = t.name
	if err := UploadBlock(ctx, db.bkt, dir, meta, labels, SourceReceive); err != nil {
		return err
	}
	switch ok, err := db.inBucket(ctx, meta.ULID); {
	case err != nil:
		return fmt.Errorf("check upload: %w", err)
	case !ok:
		return errors.New("upload incomplete in the bucket (objects deleted meanwhile), will upload again")
	}
	return nil
}

// inBucket reports whether block id is complete in the bucket: its
// meta.json exists, decodes and names id, and every file it lists exists
// at its size. An existing meta.json is not enough: the filesystem bucket
// writes objects in place, so a crash or a full disk can leave it empty or
// torn, a deletion of a partial upload can race the upload, and a block
// taken for shipped is deleted locally after retention. Uploading again is
// always safe: the objects are the same.
func (db *DB) inBucket(ctx context.Context, id ulid.ULID) (bool, error) {
	bkt := db.bkt
	name := path.Join(id.String(), "meta.json")
	r, err := bkt.Get(ctx, name)
	if bkt.IsObjNotFoundErr(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check meta.json: %w", err)
	}
	defer r.Close()
	var m ThanosMeta
	if err := json.NewDecoder(io.LimitReader(r, 16<<20)).Decode(&m); err != nil {
		db.logger.Warn("invalid meta.json in the bucket, uploading the block again", "block", id.String(), "err", err)
		return false, nil
	}
	if m.ULID != id {
		db.logger.Warn("meta.json in the bucket names another block, uploading the block again", "block", id.String(), "names", m.ULID.String())
		return false, nil
	}
	return db.filesInBucket(ctx, id, m.Thanos.Files)
}

// filesInBucket reports whether every file of block id but meta.json
// exists in the bucket with its listed size.
func (db *DB) filesInBucket(ctx context.Context, id ulid.ULID, files []ThanosFile) (bool, error) {
	for _, f := range files {
		if f.RelPath == "meta.json" {
			continue
		}
		attrs, err := db.bkt.Attributes(ctx, path.Join(id.String(), f.RelPath))
		if db.bkt.IsObjNotFoundErr(err) {
			db.logger.Warn("block in the bucket lacks a file, uploading it again", "block", id.String(), "file", f.RelPath)
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("check %s: %w", f.RelPath, err)
		}
		if f.SizeBytes > 0 && attrs.Size != f.SizeBytes {
			db.logger.Warn("block in the bucket has a file of the wrong size, uploading it again", "block", id.String(), "file", f.RelPath, "size", attrs.Size, "want", f.SizeBytes)
			return false, nil
		}
	}
	return true, nil
}

// Uploader is the part of a bucket UploadBlock uses.
type Uploader interface {
	Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error
}

// UploadBlock uploads the block in dir (chunks and index) as meta.ULID, then
// its meta.json last, with the thanos section Thanos needs: labels (the
// tenant and the external labels), source, and the files with their sizes.
// Readers treat a block without meta.json as an upload in progress.
func UploadBlock(ctx context.Context, bkt Uploader, dir string, meta tsdb.BlockMeta, labels map[string]string, source string) error {
	return UploadThanosBlock(ctx, bkt, dir, ThanosMeta{BlockMeta: meta, Thanos: ThanosSection{Labels: labels, Source: source}})
}

// UploadThanosBlock is UploadBlock with the whole thanos section given, as
// a rewrite keeps its source's (labels, downsample resolution, index stats,
// extensions); the version and the files are set here.
func UploadThanosBlock(ctx context.Context, bkt Uploader, dir string, meta ThanosMeta) error {
	id := meta.ULID.String()
	files, err := blockFiles(dir)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := uploadFile(ctx, bkt, filepath.Join(dir, filepath.FromSlash(f.RelPath)), path.Join(id, f.RelPath)); err != nil {
			return err
		}
	}
	body, err := json.MarshalIndent(withFiles(meta, files), "", "\t")
	if err != nil {
		return fmt.Errorf("encode meta.json: %w", err)
	}
	if err := bkt.Upload(ctx, path.Join(id, "meta.json"), bytes.NewReader(body)); err != nil {
		return fmt.Errorf("upload meta.json: %w", err)
	}
	return nil
}

func uploadFile(ctx context.Context, bkt Uploader, src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer f.Close()
	if err := bkt.Upload(ctx, dst, f); err != nil {
		return fmt.Errorf("upload %s: %w", dst, err)
	}
	return nil
}
