package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/phonehome/phonehome/gcburst"
	"github.com/phonehome/phonehome/storage"
)

// CompactorConfig is the `compactor:` section of the receiver config: the
// bucket's compaction, for the embedded default and any bucket with a single
// writer of compacted blocks. Enable it on one receiver per bucket. Call
// SetDefaults, then Validate.
type CompactorConfig struct {
	// Enabled defaults to false (nil means unset).
	Enabled *bool `yaml:"enabled"`
	// Ranges are the block ranges, smallest first: the receivers' blocks
	// (storage.block_duration) and what they are merged into, each a
	// multiple of the one before. Default 2h, 12h, 2d, 14d: the 14d level
	// is what makes 30-day panels as fast as Prometheus on the same data
	// (bench/results/lifecycle.md).
	Ranges []model.Duration `yaml:"ranges"`
	// Wait is how long after a range's end its blocks are compacted, so
	// that late blocks (out-of-order backlogs, slow uploads) are in.
	// Default 6h, the default out-of-order window. A block arriving later
	// still is merged at the next run.
	Wait model.Duration `yaml:"wait"`
}

// SetDefaults fills unset fields.
func (c *CompactorConfig) SetDefaults() {
	if c.Enabled == nil {
		f := false
		c.Enabled = &f
	}
	if len(c.Ranges) == 0 {
		c.Ranges = []model.Duration{model.Duration(2 * time.Hour), model.Duration(12 * time.Hour), model.Duration(48 * time.Hour), model.Duration(14 * 24 * time.Hour)}
	}
	if c.Wait == 0 {
		c.Wait = model.Duration(6 * time.Hour)
	}
}

// Validate reports every problem with its YAML path.
func (c *CompactorConfig) Validate() error {
	var errs []error
	if len(c.Ranges) < 2 {
		errs = append(errs, fmt.Errorf("compactor.ranges: want at least two ranges, got %d", len(c.Ranges)))
	}
	for i, r := range c.Ranges {
		switch {
		case r < model.Duration(time.Minute):
			errs = append(errs, fmt.Errorf("compactor.ranges[%d]: %s is shorter than 1m", i, r))
		case i > 0 && (r <= c.Ranges[i-1] || r%c.Ranges[i-1] != 0):
			errs = append(errs, fmt.Errorf("compactor.ranges[%d]: %s is not a larger multiple of %s", i, r, c.Ranges[i-1]))
		}
	}
	if c.Wait < 0 {
		errs = append(errs, fmt.Errorf("compactor.wait: %s is negative", c.Wait))
	}
	return errors.Join(errs...)
}

// replicaLabel is the external label told apart by replicas; compaction
// merges the replicas' blocks into one without it.
const replicaLabel = "replica"

// groupKey is the compaction group of a block: its labels without the
// replica label (sorted k=v pairs).
func groupKey(ls map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(ls)) {
		if k != replicaLabel {
			parts = append(parts, k+"="+ls[k])
		}
	}
	return strings.Join(parts, ",")
}

// covers reports whether a replaces b (storage.Replaces), within a tenant.
func covers(a, b *block) bool {
	return a.tenant() == b.tenant() && storage.Replaces(a.meta.BlockMeta, b.meta.BlockMeta)
}

// compact runs one compaction pass over the live blocks: it first marks
// blocks a previous run replaced but did not mark (a crash between upload
// and marks), then merges each group's blocks within each range window,
// smallest range first, one window at a time, uploading the result before
// marking its sources. It reports whether it changed the bucket.
func (r *Runner) compact(ctx context.Context, blocks []block) (changed bool, _ error) {
	now := r.now()
	var live []*block
	for i := range blocks {
		b := &blocks[i]
		if b.meta != nil && b.mark == nil && b.tenant() != "" && b.meta.Thanos.Downsample.Resolution == 0 {
			live = append(live, b)
		}
	}
	// A rerun finishes the job: sources whose result is in the bucket.
	var alive []*block
	for _, b := range live {
		replaced := slices.ContainsFunc(live, func(a *block) bool { return a != b && covers(a, b) })
		if !replaced {
			alive = append(alive, b)
			continue
		}
		if err := markForDeletion(ctx, r.bkt, b.id, "compacted", now); err != nil {
			return changed, err
		}
		r.m.marked.WithLabelValues(ReasonCompaction).Inc()
		changed = true
	}

	groups := map[string][]*block{}
	for _, b := range alive {
		k := groupKey(b.meta.Thanos.Labels)
		groups[k] = append(groups[k], b)
	}
	wait := time.Duration(r.comp.Wait).Milliseconds()
	for _, key := range slices.Sorted(maps.Keys(groups)) {
		for _, rng := range r.comp.Ranges[1:] {
			width := time.Duration(rng).Milliseconds()
			windows := map[int64][]*block{}
			for _, b := range groups[key] {
				start := floorDiv(b.meta.MinTime, width) * width
				if b.meta.MaxTime-1 >= start+width {
					continue // spans more than one window of this range
				}
				windows[start] = append(windows[start], b)
			}
			for _, start := range slices.Sorted(maps.Keys(windows)) {
				ws := windows[start]
				if len(ws) < 2 || start+width > now.UnixMilli()-wait {
					continue
				}
				if err := r.compactWindow(ctx, key, ws); err != nil {
					r.m.failures.WithLabelValues("compact").Inc()
					return changed, fmt.Errorf("compact group {%s} window %s: %w", key, time.UnixMilli(start).UTC().Format(time.RFC3339), err)
				}
				// The group changed: plan it again from a fresh scan.
				return true, nil
			}
		}
	}
	return changed, nil
}

// compactWindow downloads the blocks, merges them with TSDB's leveled
// compactor (overlapping blocks vertically, identical samples of several
// replicas kept once), uploads the result and then marks the sources.
func (r *Runner) compactWindow(ctx context.Context, key string, ws []*block) error {
	work := filepath.Join(r.workDir, "compact")
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var dirs []string
	labels := map[string]string{}
	for _, b := range ws {
		dir := filepath.Join(work, b.id.String())
		if err := download(ctx, r.bkt, b.id, dir); err != nil {
			return err
		}
		dirs = append(dirs, dir)
		for k, v := range b.meta.Thanos.Labels {
			if k != replicaLabel {
				labels[k] = v
			}
		}
	}
	var ranges []int64
	for _, rg := range r.comp.Ranges {
		ranges = append(ranges, time.Duration(rg).Milliseconds())
	}
	c, err := tsdb.NewLeveledCompactor(ctx, nil, r.logger, ranges, nil, nil)
	if err != nil {
		return err
	}
	out := filepath.Join(work, "out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	endBurst := gcburst.BeginIfQuiet() // its garbage would grow the heap to the GC goal
	ids, err := c.Compact(out, dirs, nil)
	endBurst()
	if err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	var sourcesSize int64
	for _, b := range ws {
		for _, f := range b.meta.Thanos.Files {
			sourcesSize += f.SizeBytes
		}
	}
	for _, id := range ids {
		dir := filepath.Join(out, id.String())
		meta, err := readLocalMeta(dir)
		if err != nil {
			return err
		}
		if err := r.upload(ctx, dir, meta.BlockMeta, labels); err != nil {
			return err
		}
		r.logger.Info("blocks compacted", "group", key, "block", id.String(), "sources", len(ws),
			"min_time", time.UnixMilli(meta.MinTime).UTC(), "max_time", time.UnixMilli(meta.MaxTime).UTC(), "level", meta.Compaction.Level,
			"source_bytes", sourcesSize)
	}
	r.m.compactions.Inc()
	now := r.now()
	for _, b := range ws {
		if err := markForDeletion(ctx, r.bkt, b.id, "compacted", now); err != nil {
			return err
		}
		r.m.marked.WithLabelValues(ReasonCompaction).Inc()
	}
	return nil
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// upload uploads a block made by the compactor with the group's labels.
func (r *Runner) upload(ctx context.Context, dir string, meta tsdb.BlockMeta, labels map[string]string) error {
	return storage.UploadBlock(ctx, r.bkt, dir, meta, labels, storage.SourceCompactor)
}
