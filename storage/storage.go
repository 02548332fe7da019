// Package storage owns the receiver's local TSDBs (one per tenant, each with a
// WAL and a head) and ships their blocks to an object storage bucket in a
// layout Thanos can read. It is the only package that imports tsdb or the
// objstore providers.
package storage

import (
	"context"
	"errors"

	"github.com/prometheus/prometheus/prompb"
)

// ErrNotReady is returned while the storage is opening or closing.
var ErrNotReady = errors.New("storage not ready")

// Stats counts what one Write call committed to the WAL.
type Stats struct {
	Samples    int
	Histograms int
	Exemplars  int
	// ExemplarsRefused counts exemplars not stored (exemplar storage
	// disabled, out of order, invalid). They never fail the write.
	ExemplarsRefused int
}

// Writer persists remote-write series for one tenant.
//
// Write is safe for concurrent use. It must not retain series or any of their
// labels or label strings after it returns: those alias the request buffer
// the receiver reuses for the next request. Labels are expected to be valid and sorted (the
// caller validates them). Write appends every sample it can, commits them to
// the WAL before it returns, and reports what it committed in Stats. Samples
// the TSDB refuses (out of order beyond the window, too old, a different value
// for an existing timestamp) are skipped and reported in the returned error,
// which wraps the promstorage sentinel (ErrOutOfOrderSample, ErrTooOldSample,
// ErrOutOfBounds, ErrDuplicateSampleForTimestamp); *DB returns a *PartialError
// with the count, and Stats for what it did commit. Resending samples already
// stored with identical values is not an error. Any other error means nothing
// of the call was committed.
type Writer interface {
	Write(ctx context.Context, tenant string, series []prompb.TimeSeries) (Stats, error)
}
