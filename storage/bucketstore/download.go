package bucketstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
)

// errClosed is an acquire after Close.
var errClosed = errors.New("bucket store closed")

// download is the fetch of one block, shared by every query that wants the
// block. It runs in its own goroutine, bounded by DownloadTimeout rather
// than by any query's context, so that a query that stops waiting does not
// fail it for the others. It is cancelled once no query waits for it: with
// a hanging bucket, downloads nobody wants would otherwise pile up, beyond
// the per-query limit, until DownloadTimeout. The fields other than done
// and cancel are guarded by Store.mu; done is closed under Store.mu once
// e and err are final.
type download struct {
	done      chan struct{}
	cancel    context.CancelFunc
	waiters   int  // queries waiting; each gets a pin on e when it succeeds
	abandoned bool // cancelled because waiters dropped to 0
	e         *entry
	err       error
}

// acquire returns the open block id, pinned until release, downloading it
// if needed. It waits for the download until ctx ends, and then returns an
// error wrapping ctx.Err().
func (s *Store) acquire(ctx context.Context, id ulid.ULID) (*entry, error) {
	for {
		s.mu.Lock()
		if e, ok := s.cache[id]; ok {
			e.refs++
			s.lru.MoveToFront(e.elem)
			s.mu.Unlock()
			s.m.cacheHits.Inc()
			return e, nil
		}
		if s.closed {
			s.mu.Unlock()
			return nil, errClosed
		}
		d := s.downloads[id]
		if d == nil {
			if pinned := s.pinnedLocked(); pinned >= s.opts.CacheMaxBytes {
				s.mu.Unlock()
				s.m.downloads.WithLabelValues("cache_full").Inc()
				return nil, fmt.Errorf("%w: %d bytes of blocks are in use by running queries", errCacheFull, pinned)
			}
			d = s.startDownloadLocked(id)
		}
		joined := !d.abandoned
		if joined {
			d.waiters++
		}
		s.mu.Unlock()

		select {
		case <-d.done:
		case <-ctx.Done():
		}
		if joined {
			return s.await(ctx, d)
		}
		// A cancelled download still ending: its files are in <id>.tmp,
		// so the next one starts only after it.
		if ctx.Err() != nil {
			return nil, waitErr(ctx)
		}
	}
}

// await returns the outcome of d, which the caller joined, or leaves it if
// ctx ended first.
func (s *Store) await(ctx context.Context, d *download) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-d.done: // closed under s.mu: final, and e is pinned for us
		return d.e, d.err
	default:
	}
	d.waiters--
	if d.waiters == 0 {
		d.abandoned = true
		d.cancel()
	}
	return nil, waitErr(ctx)
}

// errCacheFull refuses to download a block while the blocks in use by
// running queries fill the cache's budget: one query over a long range must
// not fill the disk the WAL and the head share. The block's data is missing
// from the answer, with a warning.
var errCacheFull = errors.New("not downloaded: the block cache (bucket_store.cache_max_bytes) is full of blocks in use by running queries; narrow the time range or raise the budget")

// pinnedLocked is the size of the cached blocks in use by queries, which
// eviction cannot free.
func (s *Store) pinnedLocked() int64 {
	var n int64
	for _, e := range s.cache {
		if e.refs > 0 {
			n += e.size
		}
	}
	return n
}

func waitErr(ctx context.Context) error {
	return fmt.Errorf("wait for download: %w", ctx.Err())
}

// startDownloadLocked starts fetching id in the background.
func (s *Store) startDownloadLocked(id ulid.ULID) *download {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.DownloadTimeout)
	d := &download{done: make(chan struct{}), cancel: cancel}
	s.downloads[id] = d
	s.running.Go(func() {
		defer cancel()
		e, err := s.fetch(ctx, id)
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.downloads, id)
		if err == nil {
			e.refs = d.waiters
			s.addLocked(e)
			s.evictLocked()
		}
		d.e, d.err = e, err
		close(d.done)
	})
	return d
}

// release unpins e and evicts what exceeds the budget.
func (s *Store) release(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.refs--
	if s.blocks[e.id].meta == nil && e.refs == 0 && s.cache[e.id] == e {
		s.removeLocked(e) // deleted from the bucket or marked meanwhile
	}
	s.evictLocked()
}

// fetch downloads every object of block id into <dir>/<id>.tmp, renames it to
// <dir>/<id> and opens it.
func (s *Store) fetch(ctx context.Context, id ulid.ULID) (_ *entry, err error) {
	start := time.Now()
	defer func() {
		switch {
		case err == nil:
			s.m.downloads.WithLabelValues("success").Inc()
			s.m.downloadSeconds.Observe(time.Since(start).Seconds())
		case errors.Is(ctx.Err(), context.Canceled): // no query waited any more, or Close
			s.m.downloads.WithLabelValues("cancelled").Inc()
		default:
			s.m.downloads.WithLabelValues("error").Inc()
		}
	}()
	final := filepath.Join(s.dir, id.String())
	tmp := final + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	var objects []string
	if err := s.bkt.Iter(ctx, id.String(), func(name string) error {
		objects = append(objects, name)
		return nil
	}, objstore.WithRecursiveIter()); err != nil {
		return nil, fmt.Errorf("list block objects: %w", err)
	}
	var n int64
	for _, name := range objects {
		rel := strings.TrimPrefix(name, id.String()+"/")
		if rel == name || rel == "" || strings.Contains(rel, "..") {
			continue
		}
		w, err := s.get(ctx, name, filepath.Join(tmp, filepath.FromSlash(rel)))
		if err != nil {
			return nil, err
		}
		n += w
	}
	s.m.downloadBytes.Add(float64(n))
	if err := os.RemoveAll(final); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, fmt.Errorf("rename downloaded block: %w", err)
	}
	b, err := tsdb.OpenBlock(s.logger, final, nil, nil)
	if err != nil {
		_ = os.RemoveAll(final)
		return nil, fmt.Errorf("open block: %w", err)
	}
	return &entry{id: id, block: b, size: b.Size()}, nil
}

func (s *Store) get(ctx context.Context, name, dst string) (int64, error) {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return 0, err
	}
	r, err := s.bkt.Get(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("get %s: %w", name, err)
	}
	defer r.Close()
	f, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("download %s: %w", name, err)
	}
	return n, nil
}
