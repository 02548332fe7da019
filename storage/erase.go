package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/phonehome/phonehome/atomicfile"
)

// ClusterErasedRefusal is why a write of an erased cluster is refused, and
// how an operator lifts it (docs/lifecycle.md); the receiver's write and
// push paths answer it too.
const ClusterErasedRefusal = `cluster was erased: its writes are refused until an admin re-admits it (POST /api/v1/admin/readmit {"cluster_id": ...} with an admin token, or receiver erase --readmit; docs/lifecycle.md)`

// ErrClusterErased is the refusal of a series of an erased cluster that has
// not been re-admitted (see DB.Deny). It wraps ErrInvalidSample: a client
// error that retrying does not fix.
var ErrClusterErased = fmt.Errorf("%s: %w", ClusterErasedRefusal, ErrInvalidSample)

// clusterLabel is the label carrying a series' cluster.
const clusterLabel = "_id"

// denyFile lists erased clusters whose writes are refused, under the
// storage path. It holds digests only: the point of an erasure is that no
// byte of the cluster's id is left.
const denyFile = "erased-clusters.json"

// ClusterDigest is how the deny list, audit events and erasure reports name a
// cluster without its id: hex SHA-256 of tenant, a zero byte and the id.
func ClusterDigest(tenant, clusterID string) string {
	h := sha256.Sum256([]byte(tenant + "\x00" + clusterID))
	return hex.EncodeToString(h[:])
}

type denyEntry struct {
	Tenant  string    `json:"tenant"`
	Digest  string    `json:"cluster_sha256"`
	Since   time.Time `json:"since"`
	Comment string    `json:"comment,omitempty"`
}

// denyList is the set of erased clusters, safe for concurrent use.
type denyList struct {
	path string
	mu   sync.RWMutex
	set  map[string]map[string]denyEntry // tenant → digest → entry
}

func loadDenyList(path string) (*denyList, error) {
	d := &denyList{path: path, set: map[string]map[string]denyEntry{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read deny list: %w", err)
	}
	var entries []denyEntry
	if err := json.Unmarshal(b, &entries); err != nil {
		return nil, fmt.Errorf("decode deny list %s: %w", path, err)
	}
	for _, e := range entries {
		if d.set[e.Tenant] == nil {
			d.set[e.Tenant] = map[string]denyEntry{}
		}
		d.set[e.Tenant][e.Digest] = e
	}
	return d, nil
}

// saveLocked writes the list atomically. d.mu must be held.
func (d *denyList) saveLocked() error {
	var entries []denyEntry
	for _, m := range d.set {
		for _, e := range m {
			entries = append(entries, e)
		}
	}
	slices.SortFunc(entries, func(a, b denyEntry) int {
		return strings.Compare(a.Tenant+a.Digest, b.Tenant+b.Digest)
	})
	b, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(d.path, b, 0o640); err != nil {
		return fmt.Errorf("write deny list: %w", err)
	}
	return nil
}

// checker returns a per-call test of series labels for the tenant, nil when
// the tenant has no denied cluster (the common case costs nothing).
func (d *denyList) checker(tenant string) func([]prompb.Label) bool {
	d.mu.RLock()
	set := d.set[tenant]
	d.mu.RUnlock()
	if len(set) == 0 {
		return nil
	}
	var lastID string
	var lastDenied, known bool
	return func(ls []prompb.Label) bool {
		for _, l := range ls {
			if l.Name != clusterLabel {
				continue
			}
			if !known || l.Value != lastID { // a request is mostly one cluster
				lastID = strings.Clone(l.Value)
				d.mu.RLock()
				_, lastDenied = d.set[tenant][ClusterDigest(tenant, l.Value)]
				d.mu.RUnlock()
				known = true
			}
			return lastDenied
		}
		return false
	}
}

// Deny refuses every later write of a series whose _id is clusterID in
// tenant (ErrClusterErased), until Readmit. Only a digest is kept.
func (db *DB) Deny(tenant, clusterID, comment string) error {
	if err := validTenant(tenant); err != nil {
		return err
	}
	d := db.deny
	d.mu.Lock()
	defer d.mu.Unlock()
	dig := ClusterDigest(tenant, clusterID)
	if _, ok := d.set[tenant][dig]; ok {
		return nil
	}
	if d.set[tenant] == nil {
		d.set[tenant] = map[string]denyEntry{}
	}
	d.set[tenant][dig] = denyEntry{Tenant: tenant, Digest: dig, Since: db.now().UTC(), Comment: comment}
	db.m.denied.Set(float64(d.lenLocked()))
	return d.saveLocked()
}

// Readmit lifts Deny; it reports whether the cluster was denied.
func (db *DB) Readmit(tenant, clusterID string) (bool, error) {
	d := db.deny
	d.mu.Lock()
	defer d.mu.Unlock()
	dig := ClusterDigest(tenant, clusterID)
	if _, ok := d.set[tenant][dig]; !ok {
		return false, nil
	}
	delete(d.set[tenant], dig)
	db.m.denied.Set(float64(d.lenLocked()))
	return true, d.saveLocked()
}

// Denied reports whether clusterID of tenant is denied. It is on the write
// path: a tenant without denied clusters costs no digest.
func (db *DB) Denied(tenant, clusterID string) bool {
	db.deny.mu.RLock()
	defer db.deny.mu.RUnlock()
	set := db.deny.set[tenant]
	if len(set) == 0 {
		return false
	}
	_, ok := set[ClusterDigest(tenant, clusterID)]
	return ok
}

func (d *denyList) lenLocked() int {
	n := 0
	for _, m := range d.set {
		n += len(m)
	}
	return n
}

// LocalErasure reports what EraseLocal removed.
type LocalErasure struct {
	// Series is the number of matching series found in the head and the
	// local blocks (a series in several blocks counts in each).
	Series int
	// BlocksRewritten are local blocks not yet uploaded, rewritten without
	// the series; BlocksDropped are uploaded local copies removed (the
	// bucket's copies are rewritten by the bucket erasure).
	BlocksRewritten, BlocksDropped int
}

// EraseLocal removes every series of tenant matching ms from the head, the
// WAL and the local blocks, so that no byte of them is left in the tenant's
// directory when it returns:
//
//  1. tombstones for the series in the head and every block;
//  2. the whole head (in-order and out-of-order) is persisted into blocks,
//     which applies the tombstones, and the new blocks get tombstones too
//     (the out-of-order head's compaction does not apply them);
//  3. the tenant's TSDB is closed, its WAL, out-of-order WAL and head chunks
//     are deleted (everything in them is in blocks now) and so are the
//     local blocks already uploaded (their bucket copies are the bucket
//     erasure's job, and queries read them from the bucket);
//  4. the remaining blocks are rewritten (RewriteBlock) without the series
//     and without any symbol of theirs (forbidden: e.g. the cluster's id,
//     which head-cut blocks list even where it has no samples), and the
//     TSDB is reopened; the shipper uploads the new blocks.
//
// Writes and reads of every tenant wait while it runs, and no block is
// uploaded meanwhile. It is idempotent: a second run finds nothing. An
// unknown tenant has nothing to erase.
func (db *DB) EraseLocal(ctx context.Context, tenant string, ms []*labels.Matcher, forbidden []string) (LocalErasure, error) {
	var res LocalErasure
	if err := validTenant(tenant); err != nil {
		return res, err
	}
	if len(ms) == 0 {
		return res, errors.New("erase: no matchers")
	}
	db.compactMtx.Lock()
	defer db.compactMtx.Unlock()
	db.shipMtx.Lock()
	defer db.shipMtx.Unlock()
	db.lifecycle.Lock()
	defer db.lifecycle.Unlock()
	if db.closed {
		return res, ErrNotReady
	}
	t := db.tenant(tenant)
	if t == nil {
		return res, nil
	}
	n, err := countSeries(ctx, t.db, ms)
	if err != nil {
		return res, err
	}
	res.Series = n
	if err := t.db.Delete(ctx, math.MinInt64, math.MaxInt64, ms...); err != nil {
		return res, fmt.Errorf("tombstone series: %w", err)
	}
	if err := flushHead(t.db, db.blockMs()); err != nil {
		return res, fmt.Errorf("flush head: %w", err)
	}
	if err := t.db.Delete(ctx, math.MinInt64, math.MaxInt64, ms...); err != nil {
		return res, fmt.Errorf("tombstone series in flushed blocks: %w", err)
	}
	var uploaded, local []string
	for _, b := range t.db.Blocks() {
		if t.isUploaded(b.Meta().ULID) {
			uploaded = append(uploaded, b.Dir())
		} else {
			local = append(local, b.Dir())
		}
	}
	if err := t.meta.save(t.dir); err != nil {
		return res, err
	}
	if err := t.db.Close(); err != nil {
		return res, fmt.Errorf("close tenant %s: %w", tenant, err)
	}
	err = db.eraseClosed(ctx, t, uploaded, local, ms, forbidden, &res)
	// Reopen whatever happened, so the tenant keeps working; a failed
	// erasure is run again (every step is idempotent).
	nt, oerr := openTenant(db.logger, db.reg, db.dir, tenant, db.cfg, db.now)
	db.tenantsMtx.Lock()
	if oerr != nil {
		delete(db.tenants, tenant) // the next write tries to open it again
	} else {
		db.tenants[tenant] = nt
	}
	db.tenantsMtx.Unlock()
	return res, errors.Join(err, oerr)
}

// eraseClosed is the part of EraseLocal that runs while the tenant's TSDB
// is closed: it deletes the WAL, the out-of-order WAL, the head chunks and
// the uploaded blocks, and rewrites the other blocks.
func (db *DB) eraseClosed(ctx context.Context, t *tenant, uploaded, local []string, ms []*labels.Matcher, forbidden []string, res *LocalErasure) error {
	for _, sub := range []string{"wal", "wbl", "chunks_head"} {
		if err := os.RemoveAll(filepath.Join(t.dir, sub)); err != nil {
			return fmt.Errorf("remove %s: %w", sub, err)
		}
	}
	for _, dir := range uploaded {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove uploaded block: %w", err)
		}
		res.BlocksDropped++
	}
	if err := removeTempDirs(t.dir); err != nil {
		return err
	}
	for _, dir := range local {
		rw, err := RewriteBlock(ctx, db.logger, dir, t.dir, ms, forbidden)
		if err != nil {
			return err
		}
		if !rw.Rewritten {
			continue
		}
		// The new block is complete (TSDB renames it into place last);
		// a crash before this removal leaves both, and a rerun rewrites
		// the old one again.
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove rewritten block: %w", err)
		}
		res.BlocksRewritten++
	}
	return nil
}

// removeTempDirs removes TSDB's leftovers of interrupted block writes and
// deletions (<ulid>.tmp-for-creation, .tmp-for-deletion) in dir.
func removeTempDirs(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.IsDir() && strings.Contains(e.Name(), ".tmp") {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// countSeries counts the series matching ms in the head and each block.
func countSeries(ctx context.Context, db *tsdb.DB, ms []*labels.Matcher) (int, error) {
	q, err := db.Querier(math.MinInt64, math.MaxInt64)
	if err != nil {
		return 0, err
	}
	defer q.Close()
	ss := q.Select(ctx, false, nil, ms...)
	n := 0
	for ss.Next() {
		n++
	}
	return n, ss.Err()
}

// replacingRegisterer registers a tenant TSDB's metrics, replacing those of
// the same tenant's previous TSDB (closed by EraseLocal): TSDB never
// unregisters its metrics on Close.
type replacingRegisterer struct{ prometheus.Registerer }

func (r replacingRegisterer) Register(c prometheus.Collector) error {
	err := r.Registerer.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		r.Unregister(are.ExistingCollector)
		return r.Registerer.Register(c)
	}
	return err
}

func (r replacingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}
