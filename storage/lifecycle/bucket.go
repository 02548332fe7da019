// Package lifecycle manages the blocks in the bucket after the receivers
// shipped them: retention, the delayed deletion of marked blocks, cleaning
// abandoned uploads, compaction and erasure. It follows Thanos' on-bucket
// conventions (meta.json uploaded last, deletion-mark.json before a delete),
// so a Thanos Compactor or Store Gateway can share or take over the bucket.
package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
)

// Object names inside a block directory.
const (
	MetaFile         = "meta.json"
	IndexFile        = "index"
	DeletionMarkFile = "deletion-mark.json"
)

// DeletionMark is Thanos' deletion-mark.json (pkg/block/metadata): the block
// is deleted DeletionDelay after DeletionTime; readers stop using it at once.
type DeletionMark struct {
	ID ulid.ULID `json:"id"`
	// DeletionTime is when the mark was written, in Unix seconds.
	DeletionTime int64  `json:"deletion_time"`
	Version      int    `json:"version"`
	Details      string `json:"details,omitempty"`
}

// block is one block directory found in the bucket.
type block struct {
	id   ulid.ULID
	meta *storage.ThanosMeta // nil: no meta.json (upload in progress, abandoned, or being deleted)
	mark *DeletionMark       // nil: not marked
}

func (b block) tenant() string {
	if b.meta == nil {
		return ""
	}
	return b.meta.Thanos.Labels[tenantLabel]
}

// tenantLabel is the thanos.labels key of the tenant.
const tenantLabel = "tenant_id"

// scan lists the block directories of the bucket root and reads each one's
// meta.json and deletion mark, 16 blocks at a time. err is the listing's
// failure. A block whose meta.json or mark could not be read or decoded (a
// bucket error, a torn or foreign meta.json) is left out of blocks and is in
// unreadable with why: a block is only taken for a partial upload when its
// meta.json is known to be absent, so a 503 never deletes a block.
func scan(ctx context.Context, bkt objstore.BucketReader) (blocks []block, unreadable map[ulid.ULID]error, err error) {
	var ids []ulid.ULID
	if err := bkt.Iter(ctx, "", func(name string) error {
		if id, err := ulid.ParseStrict(strings.TrimSuffix(name, "/")); err == nil {
			ids = append(ids, id)
		}
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("list bucket: %w", err)
	}
	all := make([]block, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			all[i], errs[i] = readBlock(ctx, bkt, id)
		}()
	}
	wg.Wait()
	blocks = all[:0]
	for i, b := range all {
		if errs[i] != nil {
			if unreadable == nil {
				unreadable = map[ulid.ULID]error{}
			}
			unreadable[b.id] = errs[i]
			continue
		}
		blocks = append(blocks, b)
	}
	return blocks, unreadable, nil
}

// readBlock reads block id's meta.json and deletion mark.
func readBlock(ctx context.Context, bkt objstore.BucketReader, id ulid.ULID) (block, error) {
	b := block{id: id}
	var meta storage.ThanosMeta
	switch ok, err := readJSON(ctx, bkt, path.Join(id.String(), MetaFile), &meta); {
	case err != nil:
		return b, err
	case ok && meta.ULID != id:
		return b, fmt.Errorf("%s/meta.json names block %s", id, meta.ULID)
	case ok:
		b.meta = &meta
	}
	var mark DeletionMark
	switch ok, err := readJSON(ctx, bkt, path.Join(id.String(), DeletionMarkFile), &mark); {
	case err != nil:
		return b, err
	case ok:
		b.mark = &mark
	}
	return b, nil
}

// joinUnreadable returns the errors of unreadable blocks, in block order.
func joinUnreadable(unreadable map[ulid.ULID]error) error {
	var errs []error
	for _, id := range slices.SortedFunc(maps.Keys(unreadable), ulid.ULID.Compare) {
		errs = append(errs, fmt.Errorf("block %s left alone: %w", id, unreadable[id]))
	}
	return errors.Join(errs...)
}

// readJSON decodes the object name into v; ok is false if it does not exist.
func readJSON(ctx context.Context, bkt objstore.BucketReader, name string, v any) (ok bool, err error) {
	r, err := bkt.Get(ctx, name)
	if bkt.IsObjNotFoundErr(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get %s: %w", name, err)
	}
	defer r.Close()
	if err := json.NewDecoder(io.LimitReader(r, 16<<20)).Decode(v); err != nil {
		return false, fmt.Errorf("decode %s: %w", name, err)
	}
	return true, nil
}

// markForDeletion writes id's deletion-mark.json unless it has one. Readers
// stop using the block at their next sync; it is deleted after the delay.
func markForDeletion(ctx context.Context, bkt objstore.Bucket, id ulid.ULID, details string, now time.Time) error {
	name := path.Join(id.String(), DeletionMarkFile)
	exists, err := bkt.Exists(ctx, name)
	if err != nil {
		return fmt.Errorf("check deletion mark of %s: %w", id, err)
	}
	if exists {
		return nil
	}
	b, err := json.Marshal(DeletionMark{ID: id, DeletionTime: now.Unix(), Version: 1, Details: details})
	if err != nil {
		return err
	}
	if err := bkt.Upload(ctx, name, strings.NewReader(string(b))); err != nil {
		return fmt.Errorf("upload deletion mark of %s: %w", id, err)
	}
	return nil
}

// deleteBlock deletes every object of block id, in Thanos' order: meta.json
// first (from then on every reader treats the block as a partial upload),
// the deletion mark last (so a crash half-way leaves a marked block that the
// next run finishes deleting). It returns the bytes deleted.
func deleteBlock(ctx context.Context, bkt objstore.Bucket, id ulid.ULID) (int64, error) {
	return deleteObjects(ctx, bkt, id, false)
}

// errUploadCompleted refuses the deletion of an upload taken for partial
// whose meta.json has appeared since: a shipper finished it meanwhile.
var errUploadCompleted = errors.New("upload completed since the scan")

// deletePartial is deleteBlock for a block scanned without meta.json (an
// abandoned upload, or one holding an erased id): it fails with
// errUploadCompleted, deleting nothing, if the block has a meta.json now,
// since the shipper that completed it takes it for shipped and will
// delete its local copy.
func deletePartial(ctx context.Context, bkt objstore.Bucket, id ulid.ULID) (int64, error) {
	return deleteObjects(ctx, bkt, id, true)
}

// deleteObjects deletes meta.json first, then the index (a shipper
// completing the upload meanwhile finds it missing when it checks its
// upload, and uploads again), the other objects, and the mark last.
func deleteObjects(ctx context.Context, bkt objstore.Bucket, id ulid.ULID, partial bool) (int64, error) {
	var names []string
	if err := bkt.Iter(ctx, id.String(), func(name string) error {
		names = append(names, name)
		return nil
	}, objstore.WithRecursiveIter()); err != nil {
		return 0, fmt.Errorf("list block %s: %w", id, err)
	}
	meta, index, mark := path.Join(id.String(), MetaFile), path.Join(id.String(), IndexFile), path.Join(id.String(), DeletionMarkFile)
	if partial && slices.Contains(names, meta) {
		return 0, fmt.Errorf("block %s: %w", id, errUploadCompleted)
	}
	var ordered []string
	for _, n := range []string{meta, index} {
		if slices.Contains(names, n) {
			ordered = append(ordered, n)
		}
	}
	for _, n := range names {
		if n != meta && n != index && n != mark {
			ordered = append(ordered, n)
		}
	}
	if slices.Contains(names, mark) {
		ordered = append(ordered, mark)
	}
	var bytes int64
	for _, n := range ordered {
		if attrs, err := bkt.Attributes(ctx, n); err == nil {
			bytes += attrs.Size
		}
		if err := bkt.Delete(ctx, n); err != nil && !bkt.IsObjNotFoundErr(err) {
			return bytes, fmt.Errorf("delete %s: %w", n, err)
		}
	}
	return bytes, nil
}

// lastModified returns the newest modification time of block id's objects.
func lastModified(ctx context.Context, bkt objstore.Bucket, id ulid.ULID) (time.Time, error) {
	var names []string
	if err := bkt.Iter(ctx, id.String(), func(name string) error {
		names = append(names, name)
		return nil
	}, objstore.WithRecursiveIter()); err != nil {
		return time.Time{}, fmt.Errorf("list block %s: %w", id, err)
	}
	var newest time.Time
	for _, n := range names {
		attrs, err := bkt.Attributes(ctx, n)
		if bkt.IsObjNotFoundErr(err) {
			continue
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("attributes of %s: %w", n, err)
		}
		if attrs.LastModified.After(newest) {
			newest = attrs.LastModified
		}
	}
	return newest, nil
}
