// Package bucketstore reads the blocks that every receiver replica shipped to
// the bucket, so one receiver answers queries over the whole fleet's data:
// blocks uploaded by other replicas and blocks from before a restart on an
// empty disk. It syncs block metadata periodically, downloads blocks on
// demand into a local cache bounded by a disk budget (least recently used
// blocks are evicted), and opens them with tsdb.OpenBlock. Reader merges them
// with the receiver's local TSDB.
package bucketstore

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
)

// TenantLabel is the meta.json thanos.labels key naming a block's tenant.
const TenantLabel = "tenant_id"

// Options tunes a Store. Zero values take the defaults of Config.
type Options struct {
	SyncInterval    time.Duration
	CacheMaxBytes   int64
	DownloadTimeout time.Duration
}

// blockMeta is the part of a Thanos meta.json the store uses.
type blockMeta struct {
	tsdb.BlockMeta
	Thanos struct {
		Labels     map[string]string `json:"labels"`
		Downsample struct {
			Resolution int64 `json:"resolution"`
		} `json:"downsample"`
	} `json:"thanos"`
}

// known is a block seen in the bucket. meta is nil for blocks the store
// ignores (downsampled, no tenant, marked for deletion), remembered so they
// are not re-read.
type known struct {
	meta   *blockMeta
	marked bool // has a deletion-mark.json: never read again
}

// errInvalidMeta is a meta.json that does not decode or names another block.
var errInvalidMeta = errors.New("invalid meta.json")

// deletionMarkFile is Thanos' marker of a block that will be deleted after a
// delay (retention, compaction, erasure). Readers stop using the block.
const deletionMarkFile = "deletion-mark.json"

// entry is a downloaded, open block.
type entry struct {
	id    ulid.ULID
	block *tsdb.Block
	size  int64
	refs  int           // open queriers; an entry in use is never evicted
	elem  *list.Element // in lru, front = most recently used
}

// Store is the bucket's block index and block cache.
//
// Queriers, Sync and Run are safe for concurrent use. Run syncs until its
// context ends. Close must be called once, after every querier is closed and
// Run has returned; it cancels the downloads no query waits for any more,
// waits for them to end, and closes the open blocks but not the bucket,
// which the caller owns.
type Store struct {
	logger *slog.Logger
	bkt    objstore.BucketReader
	dir    string
	opts   Options
	m      *metrics
	closer io.Closer // the bucket, when Open made it

	syncMtx sync.Mutex // serialises Sync
	// syncedFrom is when the last successful Sync started (UnixNano).
	syncedFrom atomic.Int64
	// attempted is set once the first Sync has ended, whatever its result.
	attempted atomic.Bool

	mu        sync.Mutex
	blocks    map[ulid.ULID]known
	cache     map[ulid.ULID]*entry
	lru       *list.List
	used      int64
	downloads map[ulid.ULID]*download
	closed    bool           // no download starts after Close
	running   sync.WaitGroup // download goroutines
}

// New opens the block cache in dir (created if needed). Blocks a previous run
// left there are adopted; partial downloads are removed. reg may be nil.
func New(logger *slog.Logger, reg prometheus.Registerer, bkt objstore.BucketReader, dir string, opts Options) (*Store, error) {
	if opts.SyncInterval <= 0 {
		opts.SyncInterval = time.Minute
	}
	if opts.CacheMaxBytes <= 0 {
		opts.CacheMaxBytes = 10 << 30
	}
	if opts.DownloadTimeout <= 0 {
		opts.DownloadTimeout = 5 * time.Minute
	}
	s := &Store{
		logger: logger, bkt: bkt, dir: dir, opts: opts, m: newMetrics(reg),
		blocks:    map[ulid.ULID]known{},
		cache:     map[ulid.ULID]*entry{},
		lru:       list.New(),
		downloads: map[ulid.ULID]*download{},
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create block cache %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list block cache: %w", err)
	}
	for _, de := range entries {
		p := filepath.Join(dir, de.Name())
		id, err := ulid.ParseStrict(de.Name())
		if err != nil || !de.IsDir() {
			_ = os.RemoveAll(p) // partial downloads (<ulid>.tmp) and strays
			continue
		}
		b, err := tsdb.OpenBlock(logger, p, nil, nil)
		if err != nil {
			logger.Warn("removing unreadable cached block", "block", id.String(), "err", err)
			_ = os.RemoveAll(p)
			continue
		}
		s.addLocked(&entry{id: id, block: b, size: b.Size()})
	}
	s.evictLocked()
	return s, nil
}

// Run syncs the block metadata now and then every SyncInterval ± 10 % (so
// that replicas restarted together do not list the bucket in lockstep) until
// ctx ends. Sync failures are logged and counted, never returned: an
// unreachable bucket must not stop the receiver.
func (s *Store) Run(ctx context.Context) error {
	for {
		if err := s.Sync(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("bucket sync failed", "err", err)
		}
		t := time.NewTimer(jittered(s.opts.SyncInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Sync lists the bucket and reads the meta.json of every new block. Blocks
// without meta.json are skipped (meta.json is uploaded last, so the upload is
// still in progress), and so are blocks whose meta.json is invalid (counted,
// logged, and read again at the next sync); blocks gone from the bucket are
// forgotten and evicted from the cache once unused.
func (s *Store) Sync(ctx context.Context) (err error) {
	s.syncMtx.Lock()
	defer s.syncMtx.Unlock()
	start := time.Now()
	defer func() {
		s.attempted.Store(true)
		if err != nil {
			s.m.syncs.WithLabelValues("error").Inc()
			return
		}
		s.m.syncs.WithLabelValues("success").Inc()
		s.m.lastSync.SetToCurrentTime()
		s.syncedFrom.Store(start.UnixNano())
	}()

	list := func() ([]ulid.ULID, error) {
		var ids []ulid.ULID
		if err := s.bkt.Iter(ctx, "", func(name string) error {
			if id, err := ulid.ParseStrict(strings.TrimSuffix(name, "/")); err == nil {
				ids = append(ids, id)
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("list bucket: %w", err)
		}
		return ids, nil
	}
	ids, err := list()
	if err != nil {
		return err
	}

	// Every block not yet known to be marked is checked for a deletion
	// mark on each sync: a mark can appear at any time after meta.json.
	s.mu.Lock()
	var unmarked []ulid.ULID
	for _, id := range ids {
		if !s.blocks[id].marked {
			unmarked = append(unmarked, id)
		}
	}
	s.mu.Unlock()
	marked, err := s.deletionMarks(ctx, unmarked)
	if err != nil {
		return err
	}
	// List again after the marks: a compactor or an erasure uploads a
	// replacement completely before it marks the sources, so the
	// replacement of every block seen marked is in this listing, and a
	// source is never hidden before its replacement is known.
	if ids, err = list(); err != nil {
		return err
	}
	s.mu.Lock()
	var fresh []ulid.ULID
	for _, id := range ids {
		if _, ok := s.blocks[id]; !ok {
			fresh = append(fresh, id)
		}
	}
	s.mu.Unlock()

	found := map[ulid.ULID]known{}
	var errs []error
	for id := range marked {
		found[id] = known{marked: true}
	}
	for _, id := range fresh {
		if _, ok := marked[id]; ok {
			continue
		}
		meta, err := s.readMeta(ctx, id)
		switch {
		case err != nil && s.bkt.IsObjNotFoundErr(err):
			continue // upload in progress
		case errors.Is(err, errInvalidMeta):
			// Torn by a crash or a full disk on a filesystem bucket: one
			// such block must not fail the sync of every other block.
			// Its uploader re-uploads it while it has a copy.
			s.m.invalidMetas.Inc()
			s.logger.Warn("skipping bucket block with invalid meta.json", "block", id.String(), "err", err)
			continue
		case err != nil:
			errs = append(errs, err)
			continue
		}
		found[id] = known{meta: meta}
	}

	present := make(map[ulid.ULID]struct{}, len(ids))
	for _, id := range ids {
		present[id] = struct{}{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, k := range found {
		s.blocks[id] = k
	}
	for id := range s.blocks {
		if _, ok := present[id]; !ok {
			delete(s.blocks, id)
		}
	}
	usable := 0
	for _, k := range s.blocks {
		if k.meta != nil {
			usable++
		}
	}
	s.m.blocks.Set(float64(usable))
	for id, e := range s.cache {
		if s.blocks[id].meta == nil && e.refs == 0 { // gone or marked
			s.removeLocked(e)
		}
	}
	return errors.Join(errs...)
}

// deletionMarks returns which of ids have a deletion mark, checking up to 16
// blocks at a time.
func (s *Store) deletionMarks(ctx context.Context, ids []ulid.ULID) (map[ulid.ULID]struct{}, error) {
	var (
		mu     sync.Mutex
		marked = map[ulid.ULID]struct{}{}
		errs   []error
		wg     sync.WaitGroup
		sem    = make(chan struct{}, 16)
	)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ok, err := s.bkt.Exists(ctx, path.Join(id.String(), deletionMarkFile))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("check deletion mark of %s: %w", id, err))
			case ok:
				marked[id] = struct{}{}
			}
		}()
	}
	wg.Wait()
	return marked, errors.Join(errs...)
}

// readMeta fetches and decodes <id>/meta.json. It returns nil meta (and no
// error) for blocks the store does not serve.
func (s *Store) readMeta(ctx context.Context, id ulid.ULID) (*blockMeta, error) {
	r, err := s.bkt.Get(ctx, path.Join(id.String(), "meta.json"))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var m blockMeta
	if err := json.NewDecoder(io.LimitReader(r, 16<<20)).Decode(&m); err != nil {
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if errors.As(err, &syntax) || errors.As(err, &typ) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("decode %s/meta.json: %w: %w", id, errInvalidMeta, err)
		}
		return nil, fmt.Errorf("read %s/meta.json: %w", id, err) // the bucket failed mid-read
	}
	switch {
	case m.ULID != id:
		return nil, fmt.Errorf("%w: %s/meta.json names block %s", errInvalidMeta, id, m.ULID)
	case m.Thanos.Labels[TenantLabel] == "":
		s.logger.Debug("ignoring block without tenant", "block", id.String())
		return nil, nil
	case m.Thanos.Downsample.Resolution != 0:
		// Downsampled blocks (Thanos compactor) hold aggregate chunks
		// that only the Thanos Store Gateway can read.
		return nil, nil
	}
	return &m, nil
}

// Blocks returns the metas of the tenant's blocks known from the last syncs
// that overlap [mint, maxt], sorted by min time. For tests and debugging.
func (s *Store) Blocks(tenant string, mint, maxt int64) []tsdb.BlockMeta {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.selectLocked(tenant, mint, maxt, nil)
}

func (s *Store) selectLocked(tenant string, mint, maxt int64, skip map[ulid.ULID]struct{}) []tsdb.BlockMeta {
	var cand []tsdb.BlockMeta
	for _, k := range s.blocks {
		m := k.meta
		if m == nil || m.Thanos.Labels[TenantLabel] != tenant {
			continue
		}
		// Block time ranges are [MinTime, MaxTime).
		if m.MinTime > maxt || m.MaxTime <= mint {
			continue
		}
		cand = append(cand, m.BlockMeta)
	}
	var out []tsdb.BlockMeta
	for _, m := range withoutReplaced(cand) {
		if _, ok := skip[m.ULID]; !ok {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b tsdb.BlockMeta) int {
		if a.MinTime != b.MinTime {
			return int(min(max(a.MinTime-b.MinTime, -1), 1))
		}
		return a.ULID.Compare(b.ULID)
	})
	return out
}

// withoutReplaced drops every block whose compaction sources are all among
// another block's sources — a compactor's or an erasure's result replaces
// it — as Thanos' deduplicate filter does, so the same samples are never
// read twice while both are in the bucket (until the source is marked and
// deleted). Of two blocks with the same sources, the rewrite is kept
// (storage.Replaces). A block that covers another covers its time range too,
// so the blocks overlapping a query are enough to decide.
func withoutReplaced(metas []tsdb.BlockMeta) []tsdb.BlockMeta {
	bySource := map[ulid.ULID][]int{}
	for i, m := range metas {
		for _, src := range m.Compaction.Sources {
			bySource[src] = append(bySource[src], i)
		}
	}
	out := metas[:0:0]
	for i, b := range metas {
		replaced := false
		if len(b.Compaction.Sources) > 0 {
			for _, j := range bySource[b.Compaction.Sources[0]] {
				if j != i && storage.Replaces(metas[j], b) {
					replaced = true
					break
				}
			}
		}
		if !replaced {
			out = append(out, b)
		}
	}
	return out
}

func (s *Store) addLocked(e *entry) {
	e.elem = s.lru.PushFront(e)
	s.cache[e.id] = e
	s.used += e.size
	s.updateCacheGauges()
}

// removeLocked forgets e, closes its block and deletes its files. e must be unused.
func (s *Store) removeLocked(e *entry) {
	s.lru.Remove(e.elem)
	delete(s.cache, e.id)
	s.used -= e.size
	s.updateCacheGauges()
	if err := e.block.Close(); err != nil {
		s.logger.Warn("close cached block", "block", e.id.String(), "err", err)
	}
	if err := os.RemoveAll(filepath.Join(s.dir, e.id.String())); err != nil {
		s.logger.Warn("remove cached block", "block", e.id.String(), "err", err)
	}
}

// evictLocked removes least recently used, unused blocks while the cache
// exceeds its budget.
func (s *Store) evictLocked() {
	for el := s.lru.Back(); el != nil && s.used > s.opts.CacheMaxBytes; {
		prev := el.Prev()
		if e := el.Value.(*entry); e.refs == 0 {
			s.removeLocked(e)
			s.m.evictions.Inc()
		}
		el = prev
	}
}

func (s *Store) updateCacheGauges() {
	s.m.cacheBytes.Set(float64(s.used))
	s.m.cacheBlocks.Set(float64(len(s.cache)))
}

// Close closes every cached block (the files stay for the next start) and
// the bucket if Open made it. A nil Store is a no-op.
func (s *Store) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	s.closed = true
	for _, d := range s.downloads {
		d.cancel()
	}
	s.mu.Unlock()
	s.running.Wait() // a download ends under s.mu

	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.closer != nil {
		errs = append(errs, s.closer.Close())
	}
	for _, e := range s.cache {
		errs = append(errs, e.block.Close())
	}
	s.cache = map[ulid.ULID]*entry{}
	s.lru.Init()
	s.used = 0
	return errors.Join(errs...)
}

type metrics struct {
	blocks          prometheus.Gauge
	syncs           *prometheus.CounterVec
	lastSync        prometheus.Gauge
	cacheBytes      prometheus.Gauge
	cacheBlocks     prometheus.Gauge
	cacheHits       prometheus.Counter
	downloads       *prometheus.CounterVec
	downloadBytes   prometheus.Counter
	downloadSeconds prometheus.Histogram
	evictions       prometheus.Counter
	invalidMetas    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		blocks: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_bucketstore_blocks", Help: "Blocks in the bucket that queries can read, as of the last sync.",
		}),
		syncs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_bucketstore_syncs_total", Help: "Bucket metadata syncs by result.",
		}, []string{"result"}),
		lastSync: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_bucketstore_last_successful_sync_timestamp_seconds", Help: "When the bucket metadata was last synced.",
		}),
		cacheBytes: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_bucketstore_cache_bytes", Help: "Bytes of downloaded blocks on local disk.",
		}),
		cacheBlocks: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_bucketstore_cache_blocks", Help: "Downloaded blocks on local disk.",
		}),
		cacheHits: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_bucketstore_cache_hits_total", Help: "Block reads served from the local cache.",
		}),
		downloads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_bucketstore_downloads_total", Help: "Block downloads by result; cancelled: no query waited for it any more; cache_full: not started, the blocks in use by queries fill cache_max_bytes.",
		}, []string{"result"}),
		downloadBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_bucketstore_download_bytes_total", Help: "Bytes downloaded from the bucket.",
		}),
		downloadSeconds: f.NewHistogram(prometheus.HistogramOpts{
			Name: "phonehome_bucketstore_download_duration_seconds", Help: "Time to download one block.",
			Buckets: prometheus.ExponentialBuckets(0.05, 4, 8),
		}),
		evictions: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_bucketstore_evictions_total", Help: "Blocks evicted from the local cache to stay within its budget.",
		}),
		invalidMetas: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_bucketstore_invalid_meta_total", Help: "Reads of a block's meta.json that did not decode or named another block; the block is skipped until a sync reads a valid one.",
		}),
	}
	for _, r := range []string{"success", "error"} {
		m.syncs.WithLabelValues(r)
	}
	for _, r := range []string{"success", "error", "cancelled", "cache_full"} {
		m.downloads.WithLabelValues(r)
	}
	return m
}

// jittered returns d ± 10 %, uniformly distributed.
func jittered(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
}
