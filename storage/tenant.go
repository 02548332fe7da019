package storage

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/compression"
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

// openTenant opens (creating if needed) the TSDB in dir/tenants/<name>.
// WAL replay happens here.
func openTenant(logger *slog.Logger, reg prometheus.Registerer, dir, name string, cfg Config, now func() time.Time) (*tenant, error) {
	t := &tenant{name: name, dir: filepath.Join(dir, "tenants", name), refs: newSeriesRefs()}
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

	var r prometheus.Registerer
	if reg != nil {
		r = replacingRegisterer{prometheus.WrapRegistererWith(prometheus.Labels{"tenant": name}, reg)}
	}
	db, err := tsdb.Open(t.dir, logger.With("tenant", name), r, opts, nil)
	if err != nil {
		return nil, fmt.Errorf("open tsdb %s: %w", t.dir, err)
	}
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
