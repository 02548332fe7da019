package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"

	"github.com/phonehome/phonehome/allowlist"
)

// eraseDownsampled deletes block b, which Thanos' compactor downsampled, if
// it holds a series matching ms or a forbidden string. It cannot be
// rewritten: Prometheus' chunk pool rejects Thanos' aggregate chunks. The
// right to erasure comes first, so the block goes whole, with the other
// series' aggregates in it; Thanos' compactor downsamples the raw blocks
// (rewritten by then) again while they are in the bucket. Only the index is
// downloaded.
func (r *Runner) eraseDownsampled(ctx context.Context, b block, ms []*labels.Matcher, forbidden []string, workDir string, res *BucketErasure) error {
	dst := filepath.Join(workDir, b.id.String()+".index")
	defer os.Remove(dst)
	if err := getFile(ctx, r.bkt, path.Join(b.id.String(), "index"), dst); err != nil {
		return err
	}
	series, found, err := indexHolds(ctx, dst, ms, forbidden)
	if err != nil {
		return err
	}
	if series == 0 && !found {
		return nil
	}
	if err := r.deleteErased(ctx, b.id, "erasure of a downsampled block", res); err != nil {
		return err
	}
	res.Series += series
	res.Downsampled++
	r.logger.Warn("downsampled block deleted whole by an erasure, with the other series in it",
		"block", b.id.String(), "tenant", b.tenant(), "resolution", time.Duration(b.meta.Thanos.Downsample.Resolution)*time.Millisecond,
		"min_time", time.UnixMilli(b.meta.MinTime).UTC(), "max_time", time.UnixMilli(b.meta.MaxTime).UTC())
	return nil
}

// indexHolds reads the index file p as storage.RewriteBlock does: the
// number of series matching ms, and whether a forbidden string is a symbol.
func indexHolds(ctx context.Context, p string, ms []*labels.Matcher, forbidden []string) (series int, found bool, err error) {
	ir, err := index.NewFileReader(p, index.DecodePostingsRaw)
	if err != nil {
		return 0, false, fmt.Errorf("open index %s: %w", p, err)
	}
	defer ir.Close()
	syms := ir.Symbols()
	for syms.Next() {
		if slices.Contains(forbidden, syms.At()) {
			found = true
			break
		}
	}
	if err := syms.Err(); err != nil {
		return 0, false, fmt.Errorf("read symbols of %s: %w", p, err)
	}
	name, value := index.AllPostingsKey()
	post, err := ir.Postings(ctx, name, value)
	if err != nil {
		return 0, false, fmt.Errorf("read postings of %s: %w", p, err)
	}
	var (
		sb   = labels.NewScratchBuilder(0)
		chks []chunks.Meta
	)
	for post.Next() {
		if err := ir.Series(post.At(), &sb, &chks); err != nil {
			return 0, false, fmt.Errorf("read series of %s: %w", p, err)
		}
		if allowlist.MatchesAll(ms, sb.Labels().Get) {
			series++
		}
	}
	if err := post.Err(); err != nil {
		return 0, false, fmt.Errorf("read postings of %s: %w", p, err)
	}
	return series, found, nil
}
