package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
)

// Reasons a block is marked for deletion, the values of the reason label.
const (
	ReasonRetention  = "retention"
	ReasonCompaction = "compaction"
	ReasonErasure    = "erasure"
)

// Runner applies retention, deletes marked blocks after the deletion delay
// and removes abandoned uploads, on one bucket.
//
// RunOnce, Run and EraseBucket are safe for concurrent use; they run one at
// a time. Several Runners on one bucket (one per replica) are safe for
// retention and deletion (every step is idempotent); only one may compact,
// and an erasure must run where the compactor runs (or while it is off).
// The bucket is the caller's, unless Open made it.
type Runner struct {
	logger  *slog.Logger
	bkt     objstore.Bucket
	cfg     storage.Config
	comp    CompactorConfig
	workDir string
	m       *metrics
	now     func() time.Time
	closer  io.Closer // the bucket, when Open made it

	// mu serialises RunOnce and EraseBucket: a compaction that read a
	// block before an erasure rewrote it must not upload its merge after.
	mu sync.Mutex
}

// Options are the optional parts of a Runner.
type Options struct {
	// Compactor enables compaction (defaults applied, validated).
	Compactor CompactorConfig
	// WorkDir holds blocks while they are compacted; required with
	// compaction.
	WorkDir string
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// New returns a Runner for bkt with the lifecycle settings of cfg (defaults
// applied and validated). reg may be nil.
func New(logger *slog.Logger, reg prometheus.Registerer, bkt objstore.Bucket, cfg storage.Config, opts Options) *Runner {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Compactor.Enabled == nil {
		opts.Compactor.SetDefaults()
	}
	return &Runner{logger: logger, bkt: bkt, cfg: cfg, comp: opts.Compactor, workDir: opts.WorkDir, m: newMetrics(reg), now: opts.Now}
}

// Run calls RunOnce at once and then every lifecycle_interval ± 10 % until
// ctx ends, then returns nil. Failures are logged and counted, never
// returned: an unreachable bucket must not stop the receiver.
func (r *Runner) Run(ctx context.Context) error {
	for {
		if err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.logger.Warn("bucket lifecycle run failed, will retry", "err", err)
		}
		d := time.Duration(r.cfg.LifecycleInterval)
		t := time.NewTimer(time.Duration(float64(d) * (0.9 + 0.2*rand.Float64())))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// RunOnce scans the bucket once: it marks blocks past their tenant's
// retention, compacts (when enabled, rescanning after each merged window),
// deletes marked blocks whose deletion delay has passed, and deletes
// uploads without meta.json untouched for the deletion delay. A block whose
// meta.json or mark cannot be read or decoded is left alone, counted as
// failures_total{operation="read_meta"} and named in the error. It goes on
// after a block's failure and returns every error.
func (r *Runner) RunOnce(ctx context.Context) (err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() {
		if err != nil {
			r.m.runs.WithLabelValues("failure").Inc()
			return
		}
		r.m.runs.WithLabelValues("success").Inc()
		r.m.lastSuccess.Set(float64(r.now().Unix()))
	}()
	blocks, unreadable, err := scan(ctx, r.bkt)
	if err != nil {
		r.m.failures.WithLabelValues("scan").Inc()
	}
	// Go on with the blocks that were read: one unreadable meta.json must
	// not stop retention for every other block.
	skipped := map[ulid.ULID]error{}
	maps.Copy(skipped, unreadable)
	errs := []error{err}
	errs = append(errs, r.applyRetention(ctx, blocks)...)
	if *r.comp.Enabled {
		for pass := 0; pass < 10_000 && ctx.Err() == nil; pass++ {
			changed, err := r.compact(ctx, blocks)
			if err != nil {
				errs = append(errs, err)
				break
			}
			if !changed {
				break
			}
			if blocks, unreadable, err = scan(ctx, r.bkt); err != nil {
				errs = append(errs, err)
				break
			}
			maps.Copy(skipped, unreadable)
		}
	}
	// Each block left alone is counted once per run, and fails the run:
	// a meta.json that stays unreadable needs an operator.
	r.m.failures.WithLabelValues("read_meta").Add(float64(len(skipped)))
	errs = append(errs, joinUnreadable(skipped))
	errs = append(errs, r.deleteMarked(ctx, blocks)...)
	return errors.Join(errs...)
}

// applyRetention marks the blocks whose max time is older than their
// tenant's retention. It updates blocks' marks in place.
func (r *Runner) applyRetention(ctx context.Context, blocks []block) []error {
	var errs []error
	now := r.now()
	for i, b := range blocks {
		if b.meta == nil || b.mark != nil || b.tenant() == "" {
			continue
		}
		ret := r.cfg.RetentionFor(b.tenant())
		if ret <= 0 || b.meta.MaxTime >= now.Add(-ret).UnixMilli() {
			continue
		}
		if err := markForDeletion(ctx, r.bkt, b.id, "retention", now); err != nil {
			r.m.failures.WithLabelValues("mark").Inc()
			errs = append(errs, err)
			continue
		}
		r.m.marked.WithLabelValues(ReasonRetention).Inc()
		r.logger.Info("block past retention marked for deletion", "block", b.id.String(), "tenant", b.tenant(),
			"max_time", time.UnixMilli(b.meta.MaxTime).UTC(), "retention", ret)
		blocks[i].mark = &DeletionMark{ID: b.id, DeletionTime: now.Unix(), Version: 1}
	}
	return errs
}

// deleteMarked deletes the blocks marked at least the deletion delay ago and
// the abandoned uploads.
func (r *Runner) deleteMarked(ctx context.Context, blocks []block) []error {
	var errs []error
	delay := time.Duration(r.cfg.DeletionDelay)
	now := r.now()
	for _, b := range blocks {
		switch {
		case b.mark != nil:
			if now.Sub(time.Unix(b.mark.DeletionTime, 0)) < delay {
				continue
			}
			n, err := deleteBlock(ctx, r.bkt, b.id)
			r.m.deletedBytes.Add(float64(n))
			if err != nil {
				r.m.failures.WithLabelValues("delete").Inc()
				errs = append(errs, err)
				continue
			}
			r.m.deleted.Inc()
			r.logger.Info("marked block deleted", "block", b.id.String(), "tenant", b.tenant(), "bytes", n)
		case b.meta == nil: // meta.json is absent: scan leaves out what it could not read
			last, err := lastModified(ctx, r.bkt, b.id)
			if err != nil {
				r.m.failures.WithLabelValues("delete").Inc()
				errs = append(errs, err)
				continue
			}
			if last.IsZero() || now.Sub(last) < delay {
				continue // an upload in progress
			}
			n, err := deletePartial(ctx, r.bkt, b.id)
			r.m.deletedBytes.Add(float64(n))
			if errors.Is(err, errUploadCompleted) {
				r.logger.Info("abandoned upload completed meanwhile, kept", "block", b.id.String())
				continue
			}
			if err != nil {
				r.m.failures.WithLabelValues("delete").Inc()
				errs = append(errs, fmt.Errorf("abandoned upload: %w", err))
				continue
			}
			r.m.partialDeleted.Inc()
			r.logger.Info("abandoned upload deleted", "block", b.id.String(), "last_modified", last.UTC(), "bytes", n)
		}
	}
	return errs
}

type metrics struct {
	runs           *prometheus.CounterVec // by result
	lastSuccess    prometheus.Gauge
	marked         *prometheus.CounterVec // by reason
	deleted        prometheus.Counter
	deletedBytes   prometheus.Counter
	partialDeleted prometheus.Counter
	failures       *prometheus.CounterVec // by operation
	compactions    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		runs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_lifecycle_runs_total", Help: "Bucket lifecycle runs (retention, deletion, compaction) by result.",
		}, []string{"result"}),
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_lifecycle_last_success_timestamp_seconds", Help: "When a bucket lifecycle run last completed without error.",
		}),
		marked: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_lifecycle_blocks_marked_total", Help: "Bucket blocks marked for deletion (deletion-mark.json) by reason.",
		}, []string{"reason"}),
		deleted: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_lifecycle_blocks_deleted_total", Help: "Marked bucket blocks deleted after the deletion delay.",
		}),
		deletedBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_lifecycle_deleted_bytes_total", Help: "Bytes of bucket objects deleted (marked blocks and abandoned uploads).",
		}),
		partialDeleted: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_lifecycle_abandoned_uploads_deleted_total", Help: "Block uploads without meta.json, untouched for the deletion delay, deleted.",
		}),
		failures: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_lifecycle_failures_total", Help: "Failed bucket lifecycle operations by operation (read_meta: a block whose meta.json or deletion mark could not be read or decoded, left alone for the run).",
		}, []string{"operation"}),
	}
	m.compactions = f.NewCounter(prometheus.CounterOpts{
		Name: "phonehome_lifecycle_compactions_total", Help: "Compacted blocks uploaded (their sources are then marked for deletion).",
	})
	for _, r := range []string{"success", "failure"} {
		m.runs.WithLabelValues(r)
	}
	for _, r := range []string{ReasonRetention, ReasonCompaction, ReasonErasure} {
		m.marked.WithLabelValues(r)
	}
	for _, op := range []string{"scan", "read_meta", "mark", "delete", "compact", "erase"} {
		m.failures.WithLabelValues(op)
	}
	return m
}

// Open opens its own client of the bucket configured in cfg (the storage:
// section, defaults applied) and returns a Runner over it that owns the
// client: Close closes it.
func Open(logger *slog.Logger, reg prometheus.Registerer, storagePath string, cfg storage.Config, comp CompactorConfig) (*Runner, error) {
	bkt, err := storage.OpenBucketReader(logger, cfg.Bucket, storagePath)
	if err != nil {
		return nil, fmt.Errorf("open bucket for the lifecycle: %w", err)
	}
	r := New(logger, reg, bkt, cfg, Options{Compactor: comp, WorkDir: filepath.Join(storagePath, "lifecycle")})
	r.closer = bkt
	return r, nil
}

// Active reports whether the configuration asks for periodic runs: a bucket
// retention is set or the compactor is enabled. Without them, blocks are
// only deleted when asked (erasure).
func (r *Runner) Active() bool { return r.cfg.HasRetention() || *r.comp.Enabled }

// Close closes the bucket client if Open made it.
func (r *Runner) Close() error {
	if r == nil || r.closer == nil {
		return nil
	}
	return r.closer.Close()
}
