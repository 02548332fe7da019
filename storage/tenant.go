package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/compression"

	"github.com/phonehome/phonehome/atomicfile"
)

var tenantRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// validTenant reports whether name is safe as a single directory name. The
// regexp already excludes "." and ".." (they must start with [A-Za-z0-9]).
func validTenant(name string) error {
	if !tenantRE.MatchString(name) {
		return fmt.Errorf("%w: %q", ErrInvalidTenant, name)
	}
	return nil
}

// tenant is one tenant's TSDB plus its shipping state.
type tenant struct {
	name string
	dir  string
	db   *tsdb.DB
	meta *metadataIndex
	refs *seriesRefs
	// incarnation tags the hints of WriteHinted: a hint holds a head
	// reference of this TSDB instance only (references restart when a tenant
	// is erased and reopened).
	incarnation uint64

	mtx      sync.Mutex
	uploaded map[ulid.ULID]struct{} // blocks in the bucket; persisted in shipperFile
}

func (t *tenant) isUploaded(id ulid.ULID) bool {
	t.mtx.Lock()
	defer t.mtx.Unlock()
	_, ok := t.uploaded[id]
	return ok
}

// markUploaded records id, keeping only ids of blocks still on disk.
func (t *tenant) markUploaded(id ulid.ULID, local []ulid.ULID) error {
	t.mtx.Lock()
	defer t.mtx.Unlock()
	t.uploaded[id] = struct{}{}
	keep := make(map[ulid.ULID]struct{}, len(t.uploaded))
	for _, l := range local {
		if _, ok := t.uploaded[l]; ok {
			keep[l] = struct{}{}
		}
	}
	t.uploaded = keep
	return writeShipped(t.dir, keep)
}

// incarnations numbers tenant TSDB instances in this process.
var incarnations atomic.Uint64

// A hint is a head reference in its low hintRefBits bits and the tenant's
// incarnation above them. 2^40 series references are far more than a head
// creates in a process' life; 2^24 incarnations (opens of tenants, each
// erasure reopens one) too.
const (
	hintRefBits         = 40
	hintIncarnationMask = 1<<(64-hintRefBits) - 1
)

// hint returns the hint for ref, which an append has accepted: 0 (none)
// when ref is 0 or too large to tag.
func (t *tenant) hint(ref promstorage.SeriesRef) uint64 {
	if ref == 0 || uint64(ref) >= 1<<hintRefBits || t.incarnation == 0 {
		return 0
	}
	return t.incarnation<<hintRefBits | uint64(ref)
}

// hintRef returns the head reference of hint h, or 0 if it is none or from
// another incarnation.
func (t *tenant) hintRef(h uint64) promstorage.SeriesRef {
	if h == 0 || h>>hintRefBits != t.incarnation {
		return 0
	}
	return promstorage.SeriesRef(h & (1<<hintRefBits - 1))
}

// openTenant opens (creating if needed) the TSDB in dir/tenants/<name>.
// WAL replay happens here.
func openTenant(logger *slog.Logger, reg prometheus.Registerer, dir, name string, cfg Config, now func() time.Time) (*tenant, error) {
	t := &tenant{name: name, dir: filepath.Join(dir, "tenants", name), refs: newSeriesRefs(), incarnation: incarnations.Add(1) & hintIncarnationMask}
	// Nothing writes the tenant's state files while it is not open (the
	// shipper and EraseLocal's reopen hold shipMtx).
	if err := atomicfile.RemoveStale(logger.With("tenant", name), filepath.Join(t.dir, shipperFile), filepath.Join(t.dir, metadataFile)); err != nil {
		return nil, err
	}
	uploaded, err := readShipped(t.dir)
	if err != nil {
		return nil, err
	}
	t.uploaded = uploaded
	// Before tsdb.Open: nothing else reads or truncates the WAL yet.
	if t.meta, err = readMetadata(logger.With("tenant", name), t.dir); err != nil {
		return nil, err
	}

	block := time.Duration(cfg.BlockDuration).Milliseconds()
	opts := tsdb.DefaultOptions()
	opts.MinBlockDuration, opts.MaxBlockDuration = block, block
	opts.OutOfOrderTimeWindow = time.Duration(cfg.OutOfOrderWindow).Milliseconds()
	// Only for the prometheus_tsdb_retention_limit_seconds metric: deletion
	// is decided by BlocksToDelete, which never drops un-uploaded blocks.
	opts.RetentionDuration = time.Duration(cfg.Retention).Milliseconds()
	opts.BlocksToDelete = t.blocksToDelete(time.Duration(cfg.Retention), now)
	// Overlapping (OOO) blocks are shipped as they are and merged by the
	// bucket's compactor; compacting them locally would re-upload the data.
	opts.EnableOverlappingCompaction = false
	opts.EnableExemplarStorage = cfg.MaxExemplars > 0
	opts.MaxExemplars = int64(cfg.MaxExemplars)
	opts.WALCompression = compression.Snappy
	// Retention is evaluated when TSDB reloads blocks; follow the shipper.
	opts.BlockReloadInterval = time.Duration(cfg.ShipInterval)
	// No isolation, and the DB cuts head blocks itself (compact.go).
	opts.IsolationDisabled = true

	var r prometheus.Registerer
	if reg != nil {
		r = replacingRegisterer{prometheus.WrapRegistererWith(prometheus.Labels{"tenant": name}, reg)}
	}
	db, err := tsdb.Open(t.dir, logger.With("tenant", name), r, opts, nil)
	if errors.Is(err, syscall.EWOULDBLOCK) { // its lock file is held
		return nil, fmt.Errorf("open tsdb %s: in use by another process (a receiver still running on this --storage.path, or a receiver erase): %w", t.dir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open tsdb %s: %w", t.dir, err)
	}
	db.DisableCompactions() // no write has started: nothing to wait for
	t.db = db
	return t, nil
}

// blocksToDelete deletes a block only when it is uploaded and entirely older
// than retention, plus blocks TSDB itself marked deletable after compaction.
func (t *tenant) blocksToDelete(retention time.Duration, now func() time.Time) tsdb.BlocksToDeleteFunc {
	return func(blocks []*tsdb.Block) map[ulid.ULID]struct{} {
		cutoff := now().Add(-retention).UnixMilli()
		del := map[ulid.ULID]struct{}{}
		for _, b := range blocks {
			m := b.Meta()
			if m.Compaction.Deletable || (m.MaxTime < cutoff && t.isUploaded(m.ULID)) {
				del[m.ULID] = struct{}{}
			}
		}
		return del
	}
}
