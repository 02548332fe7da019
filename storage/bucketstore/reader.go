package bucketstore

import (
	"context"
	"errors"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// Local is the receiver's own storage as Reader uses it (*storage.DB).
type Local interface {
	// Querier reads the tenant's head and local blocks.
	Querier(tenant string, mint, maxt int64) (promstorage.Querier, error)
	// LocalBlocks lists the tenant's blocks on local disk; their copies in
	// the bucket are not read.
	LocalBlocks(tenant string) []ulid.ULID
}

// Reader merges a tenant's local data (head and local blocks) with its
// blocks in the bucket. It implements query.Reader.
//
// Deduplication: series are returned exactly as they were written; the
// blocks' external labels (replica, region, ...) are not added to them. So
// series equal in their own labels merge across blocks and replicas, which is
// Thanos' replica-label deduplication with every external label treated as a
// replica label (safe here because every series carries the tenant's own
// _id). Merged series keep the union of their samples, one per timestamp
// (promstorage.ChainedSeriesMerge), rather than Thanos' penalty algorithm,
// which switches between replicas on gaps: that algorithm exists for HA
// Prometheus pairs that scrape at different instants, whereas remote-write
// samples carry their source timestamps, so replicas hold the same
// timestamps and the union is exact. The price is that every overlapping
// block is read.
type Reader struct {
	local Local
	store *Store
}

// NewReader returns the merged reader. A nil store reads local data only.
func NewReader(local Local, store *Store) *Reader {
	return &Reader{local: local, store: store}
}

// Querier implements query.Reader. Local data is the primary querier: its
// errors fail the query. Bucket blocks are secondaries: a block that cannot
// be fetched turns into a warning in the API response, with the data of the
// other blocks still returned (Thanos' partial response). Until the bucket
// has been listed once since the start, a warning says so: the blocks only
// in the bucket are missing (after a restart with the bucket unreachable,
// for as long as it stays so), and rules skip rather than count without them.
func (r *Reader) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	lq, err := r.local.Querier(tenant, mint, maxt)
	if err != nil {
		return nil, err
	}
	if r.store == nil {
		return lq, nil
	}
	// After opening the local querier: a block deleted locally in between
	// is then read from the bucket rather than missed.
	bq := r.store.Queriers(tenant, mint, maxt, r.local.LocalBlocks(tenant))
	if !r.store.Listed() {
		bq = append(bq, notListed{})
	}
	if len(bq) == 0 {
		return lq, nil
	}
	return promstorage.NewMergeQuerier([]promstorage.Querier{lq}, bq, promstorage.ChainedSeriesMerge), nil
}

// errNotListed is notListed's error, a warning in a merge.
var errNotListed = errors.New("the bucket has not been listed since the receiver started: data only in the bucket is missing")

// notListed stands, as a secondary, for the bucket's blocks not known yet.
type notListed struct{}

func (notListed) Select(context.Context, bool, *promstorage.SelectHints, ...*labels.Matcher) promstorage.SeriesSet {
	return promstorage.ErrSeriesSet(errNotListed)
}

func (notListed) LabelValues(context.Context, string, *promstorage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, errNotListed
}

func (notListed) LabelNames(context.Context, *promstorage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, errNotListed
}

func (notListed) Close() error { return nil }
