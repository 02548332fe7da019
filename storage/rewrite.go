package storage

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"

	"github.com/phonehome/phonehome/allowlist"
)

// Rewrite is what RewriteBlock did to one block.
type Rewrite struct {
	// Rewritten is false when the block held neither a matching series nor
	// a forbidden symbol: it was left alone.
	Rewritten bool
	// Series is the number of series removed.
	Series int
	// NewBlock is the replacement's ULID; nil when nothing was left.
	NewBlock *ulid.ULID
	// Meta is the source block's meta.
	Meta tsdb.BlockMeta
}

// RewriteBlock writes the block in srcDir without the series matching ms
// into a new block in destDir, when the block holds such a series or any
// forbidden string among its symbols. It writes a tombstones file into
// srcDir (the caller deletes srcDir afterwards).
//
// A TSDB compaction or CleanTombstones keeps the symbol table of its
// sources: strings of deleted series, and in head-cut blocks even of series
// without samples in the block, stay in the index. RewriteBlock instead
// writes only the symbols of the series it keeps, so no byte of an erased
// cluster's labels is left in the new block.
//
// The chunks of the series it keeps are copied byte for byte, never
// re-encoded, which is what lets it rewrite a block Thanos' compactor
// downsampled: their aggregate chunks (EncThanosAggr) are read as opaque
// bytes. A chunk that TSDB would have to trim to the block's time range
// fails the rewrite (errAggrReencode) rather than being lost.
func RewriteBlock(ctx context.Context, logger *slog.Logger, srcDir, destDir string, ms []*labels.Matcher, forbidden []string) (res Rewrite, err error) {
	pool := newAggrPool()
	b, err := tsdb.OpenBlock(logger, srcDir, pool, nil)
	if err != nil {
		return res, fmt.Errorf("open block %s: %w", srcDir, err)
	}
	defer func() {
		if cerr := b.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close block: %w", cerr)
		}
	}()
	res.Meta = b.Meta()
	ix, err := b.Index()
	if err != nil {
		return res, err
	}
	kept, keptSeries, removed, found, err := scanIndex(ctx, ix, ms, forbidden, false)
	if cerr := ix.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, fmt.Errorf("read index of %s: %w", srcDir, err)
	}
	if removed == 0 && !found {
		return res, nil
	}
	res.Rewritten, res.Series = true, removed
	if removed > 0 {
		if err := b.Delete(ctx, math.MinInt64, math.MaxInt64, ms...); err != nil {
			return res, fmt.Errorf("tombstone series: %w", err)
		}
	}
	c, err := tsdb.NewLeveledCompactor(ctx, nil, logger, []int64{res.Meta.MaxTime - res.Meta.MinTime}, pool, nil)
	if err != nil {
		return res, err
	}
	if err := os.MkdirAll(destDir, 0o755); err != nil {
		return res, err
	}
	meta := res.Meta
	endBurst := beginGCBurstIfQuiet() // as a head cut (compact.go)
	ids, err := c.Write(destDir, symbolFilter{Block: b, symbols: kept}, meta.MinTime, meta.MaxTime, &meta)
	endBurst()
	if err != nil {
		return res, fmt.Errorf("write rewritten block: %w", err)
	}
	if len(ids) == 0 && keptSeries > 0 {
		// TSDB writes no block whose chunks count no sample: that would
		// lose the series kept.
		return res, fmt.Errorf("rewrite of %s wrote no block, yet %d series remain", srcDir, keptSeries)
	}
	if len(ids) > 0 {
		res.NewBlock = &ids[0]
	}
	return res, nil
}

// IndexHolds reports whether the block index file at path holds a series
// matching ms or any forbidden string among its symbols: whether
// RewriteBlock would rewrite its block. It reads the index only, so that an
// erasure downloads the chunks of just the blocks it rewrites.
func IndexHolds(ctx context.Context, path string, ms []*labels.Matcher, forbidden []string) (holds bool, err error) {
	ix, err := index.NewFileReader(path, index.DecodePostingsRaw)
	if err != nil {
		return false, fmt.Errorf("open index %s: %w", path, err)
	}
	defer func() {
		if cerr := ix.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close index: %w", cerr)
		}
	}()
	_, _, removed, found, err := scanIndex(ctx, ix, ms, forbidden, true)
	if err != nil {
		return false, fmt.Errorf("read index %s: %w", path, err)
	}
	return removed > 0 || found, nil
}

// indexScanner is what scanIndex reads of an index: a block's
// (tsdb.IndexReader) or an index file's (*index.Reader).
type indexScanner interface {
	Symbols() index.StringIter
	Postings(ctx context.Context, name string, values ...string) (index.Postings, error)
	Series(ref promstorage.SeriesRef, builder *labels.ScratchBuilder, chks *[]chunks.Meta) error
}

// scanIndex returns the sorted symbols of the series not matching ms, the
// numbers of series not matching and matching, and whether any forbidden
// string is a symbol. With check, it stops at the first forbidden string or
// matching series, and collects no symbols: it only tells whether the block
// must be rewritten.
func scanIndex(ctx context.Context, ix indexScanner, ms []*labels.Matcher, forbidden []string, check bool) (kept []string, keptSeries, removed int, found bool, err error) {
	syms := ix.Symbols()
	for syms.Next() {
		if slices.Contains(forbidden, syms.At()) {
			found = true
			break
		}
	}
	if err := syms.Err(); err != nil {
		return nil, 0, 0, false, err
	}
	if check && found {
		return nil, 0, 0, true, nil
	}
	name, value := index.AllPostingsKey()
	p, err := ix.Postings(ctx, name, value)
	if err != nil {
		return nil, 0, 0, false, err
	}
	set := map[string]struct{}{}
	var (
		b    = labels.NewScratchBuilder(0)
		chks []chunks.Meta
	)
	for p.Next() {
		if err := ix.Series(p.At(), &b, &chks); err != nil {
			return nil, 0, 0, false, err
		}
		ls := b.Labels()
		if allowlist.MatchesAll(ms, ls.Get) {
			removed++
			if check {
				return nil, 0, removed, found, nil
			}
			continue
		}
		if check {
			continue
		}
		keptSeries++
		ls.Range(func(l labels.Label) {
			set[l.Name] = struct{}{}
			set[l.Value] = struct{}{}
		})
	}
	if err := p.Err(); err != nil {
		return nil, 0, 0, false, err
	}
	kept = make([]string, 0, len(set))
	for s := range set {
		kept = append(kept, s)
	}
	slices.Sort(kept)
	return kept, keptSeries, removed, found, nil
}

// symbolFilter is a block whose index lists only the given symbols, those
// of the series a rewrite keeps.
type symbolFilter struct {
	*tsdb.Block
	symbols []string
}

func (f symbolFilter) Index() (tsdb.IndexReader, error) {
	ix, err := f.Block.Index()
	if err != nil {
		return nil, err
	}
	return symbolIndex{IndexReader: ix, symbols: f.symbols}, nil
}

type symbolIndex struct {
	tsdb.IndexReader
	symbols []string
}

func (ix symbolIndex) Symbols() index.StringIter { return index.NewStringListIter(ix.symbols) }
