package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/phonehome/phonehome/atomicfile"
)

// DB is the receiver's storage: one TSDB per tenant under <dir>/tenants and
// a bucket the shipper uploads blocks to.
//
// Write, Querier, Tenants and Ready are safe for concurrent use. RunShipper
// runs at most once at a time (rounds are serialised). Close must be called
// once, after which Write and Querier return ErrNotReady. Queriers must be
// closed before Close.
type DB struct {
	logger *slog.Logger
	reg    prometheus.Registerer
	dir    string
	cfg    Config
	bkt    bucket
	m      *metrics
	now    func() time.Time // injected by tests

	ready atomic.Bool
	// lifecycle is held for reading by every Write and for writing by Close,
	// so Close waits for in-flight writes and no write starts after it.
	lifecycle sync.RWMutex
	closed    bool

	tenantsMtx sync.RWMutex
	tenants    map[string]*tenant

	shipMtx    sync.Mutex // serialises ship rounds, Close's final round and EraseLocal
	shipClosed bool
	leftLocal  []string                 // NotUploaded; set by Close under shipMtx
	shipHold   func(tenant string) bool // HoldShipping; guarded by shipMtx

	deny *denyList // erased clusters, refused by Write

	// Head compaction (compact.go).
	compactMtx      sync.Mutex // held by a compaction round; EraseLocal takes it
	compactRetries  retries
	compactNow      chan struct{} // a write made a head compactable
	stopCompact     chan struct{}
	stopCompactOnce sync.Once
	compactDone     chan struct{}
}

var _ Writer = (*DB)(nil)

// Open validates cfg (after applying defaults), opens the bucket and every
// existing tenant TSDB under dir/tenants, replaying their WALs; the DB is
// ready when Open returns. reg may be nil.
func Open(logger *slog.Logger, reg prometheus.Registerer, dir string, cfg Config) (*DB, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bkt, err := openBucket(logger, cfg.Bucket, dir)
	if err != nil {
		return nil, err
	}
	db, err := openWithBucket(logger, reg, dir, cfg, bkt, time.Now)
	if err != nil {
		return nil, errors.Join(err, bkt.Close())
	}
	return db, nil
}

// openWithBucket is Open with an injected bucket and clock (tests). cfg must
// already have defaults. The DB owns bkt and closes it.
func openWithBucket(logger *slog.Logger, reg prometheus.Registerer, dir string, cfg Config, bkt bucket, now func() time.Time) (*DB, error) {
	db := &DB{
		logger: logger, reg: reg, dir: dir, cfg: cfg, bkt: bkt, now: now,
		m:       newMetrics(reg),
		tenants: map[string]*tenant{},

		compactRetries: retries{},
		compactNow:     make(chan struct{}, 1),
		stopCompact:    make(chan struct{}),
		compactDone:    make(chan struct{}),
	}
	if err := atomicfile.RemoveStale(logger, filepath.Join(dir, denyFile)); err != nil {
		return nil, err
	}
	deny, err := loadDenyList(filepath.Join(dir, denyFile))
	if err != nil {
		return nil, err
	}
	db.deny = deny
	db.m.denied.Set(float64(deny.lenLocked()))
	tdir := filepath.Join(dir, "tenants")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		return nil, fmt.Errorf("create tenants directory: %w", err)
	}
	entries, err := os.ReadDir(tdir)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || validTenant(e.Name()) != nil {
			logger.Warn("ignoring unexpected entry in tenants directory", "name", e.Name())
			continue
		}
		t, err := openTenant(logger, reg, dir, e.Name(), cfg, now)
		if err != nil {
			return nil, errors.Join(err, db.closeTenants())
		}
		db.tenants[t.name] = t
	}
	db.m.tenants.Set(float64(len(db.tenants)))
	go db.runCompactions()
	db.signalCompaction() // a head replayed from the WAL may be compactable
	db.ready.Store(true)
	return db, nil
}

// blockMs is the block duration (storage.block_duration) in milliseconds,
// TSDB's unit.
func (db *DB) blockMs() int64 { return time.Duration(db.cfg.BlockDuration).Milliseconds() }

// Ready reports whether the DB accepts writes and reads.
func (db *DB) Ready() bool { return db.ready.Load() }

// Tenants returns the names of tenants with a TSDB, sorted.
func (db *DB) Tenants() []string {
	db.tenantsMtx.RLock()
	defer db.tenantsMtx.RUnlock()
	names := make([]string, 0, len(db.tenants))
	for n := range db.tenants {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Querier reads one tenant's local data (head and local blocks) in [mint, maxt].
// An unknown tenant yields an empty querier. Bucket blocks are merged in by
// storage/bucketstore.Reader.
func (db *DB) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	t, release, err := db.readTenant(tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	if t == nil {
		return promstorage.NoopQuerier(), nil
	}
	q, err := t.db.Querier(mint, maxt)
	if err != nil {
		return nil, fmt.Errorf("tenant %s querier: %w", tenant, err)
	}
	return q, nil
}

// readTenant returns the named tenant (nil if it has no data yet) for a read,
// holding the DB open until release is called.
func (db *DB) readTenant(name string) (t *tenant, release func(), err error) {
	if err := validTenant(name); err != nil {
		return nil, nil, err
	}
	db.lifecycle.RLock()
	if db.closed {
		db.lifecycle.RUnlock()
		return nil, nil, ErrNotReady
	}
	return db.tenant(name), db.lifecycle.RUnlock, nil
}

func (db *DB) tenant(name string) *tenant {
	db.tenantsMtx.RLock()
	defer db.tenantsMtx.RUnlock()
	return db.tenants[name]
}

// tenantForWrite returns the tenant, creating its TSDB on first use.
func (db *DB) tenantForWrite(name string) (*tenant, error) {
	if t := db.tenant(name); t != nil {
		return t, nil
	}
	db.tenantsMtx.Lock()
	defer db.tenantsMtx.Unlock()
	if t := db.tenants[name]; t != nil {
		return t, nil
	}
	t, err := openTenant(db.logger, db.reg, db.dir, name, db.cfg, db.now)
	if err != nil {
		return nil, err
	}
	db.tenants[name] = t
	db.m.tenants.Set(float64(len(db.tenants)))
	return t, nil
}

func (db *DB) snapshotTenants() []*tenant {
	db.tenantsMtx.RLock()
	defer db.tenantsMtx.RUnlock()
	ts := make([]*tenant, 0, len(db.tenants))
	for _, t := range db.tenants {
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(a, b *tenant) int { return strings.Compare(a.name, b.name) })
	return ts
}

// Close stops accepting writes, waits for in-flight ones, optionally flushes
// every head into a block and uploads pending blocks (bounded by
// shutdown_upload_timeout), then closes the TSDBs and the bucket. An error
// means a flush, the upload or a close failed; NotUploaded then names the
// blocks that only the local disk holds.
func (db *DB) Close() error {
	db.ready.Store(false)
	db.lifecycle.Lock()
	if db.closed {
		db.lifecycle.Unlock()
		return nil
	}
	db.closed = true
	db.lifecycle.Unlock()
	db.stopCompactions()

	var errs []error
	if *db.cfg.FlushOnShutdown {
		for _, t := range db.snapshotTenants() {
			if err := flushHead(t.db, db.blockMs()); err != nil {
				errs = append(errs, fmt.Errorf("flush tenant %s: %w", t.name, err))
			}
		}
	}
	db.shipMtx.Lock()
	if *db.cfg.UploadOnShutdown {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(db.cfg.ShutdownUploadTimeout))
		if err := db.shipLocked(ctx); err != nil {
			errs = append(errs, fmt.Errorf("upload on shutdown: %w", err))
		}
		cancel()
	}
	db.shipClosed = true
	db.leftLocal = db.notUploadedLocked()
	db.shipMtx.Unlock()

	errs = append(errs, db.closeTenants())
	if err := db.bkt.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close bucket: %w", err))
	}
	return errors.Join(errs...)
}

func (db *DB) closeTenants() error {
	db.tenantsMtx.Lock()
	defer db.tenantsMtx.Unlock()
	var errs []error
	for name, t := range db.tenants {
		if err := t.meta.save(t.dir); err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", name, err))
		}
		if err := t.db.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close tenant %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// flushHead persists the whole head (in-order and out-of-order) into blocks
// aligned to the block duration, as Thanos receive does on shutdown.
// It runs as a GC burst (compact.go).
func flushHead(db *tsdb.DB, blockMs int64) error {
	defer beginGCBurst()()
	head := db.Head()
	if mint, maxt := head.MinTime(), head.MaxTime(); mint != math.MaxInt64 && mint <= maxt {
		for start := mint - mod(mint, blockMs); start <= maxt; start += blockMs {
			lo, hi := max(start, mint), min(start+blockMs-1, maxt)
			if err := db.CompactHead(tsdb.NewRangeHead(head, lo, hi)); err != nil {
				return err
			}
		}
	}
	if err := db.CompactOOOHead(context.Background()); err != nil {
		return fmt.Errorf("compact out-of-order head: %w", err)
	}
	return nil
}

// mod is the non-negative remainder, for timestamps before 1970.
func mod(a, b int64) int64 { return ((a % b) + b) % b }
