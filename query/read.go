package query

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/storage/remote"
	"github.com/prometheus/prometheus/util/annotations"
)

// ReadOptions configures the remote-read handler. Zero values mean the defaults.
type ReadOptions struct {
	// MaxSamples bounds the samples of one sampled (non-streamed) response
	// (50M, as Prometheus' --storage.remote.read-sample-limit).
	MaxSamples int
	// MaxConcurrent bounds concurrent remote-read requests (10).
	MaxConcurrent int
	// MaxBytesInFrame bounds one frame of a streamed response (1MiB).
	MaxBytesInFrame int
	// Ready reports whether reads may be served; nil means always.
	Ready func() bool
}

// NewReadHandler serves the Prometheus remote-read protocol (POST
// /api/v1/read: sampled responses and streamed XOR chunks, negotiated by the
// client) over r, through Prometheus' own handler. Every query is scoped to
// the tenant of the caller's credential (auth.Middleware in front). Series
// are returned exactly as stored: no external labels are added, so a
// remote-read client sees what the query API sees. An answer known to lack
// data (MissingData: a peer or a bucket block could not be read) fails with
// 500 and the reason instead of being sent incomplete; if it becomes known
// only after a streamed response has begun (a peer that dies mid-stream),
// Prometheus' handler aborts the connection, so the client sees a broken
// response rather than a complete-looking one. reg may be nil.
func NewReadHandler(logger *slog.Logger, reg prometheus.Registerer, r Reader, opts ReadOptions) http.Handler {
	if opts.MaxSamples == 0 {
		opts.MaxSamples = 50_000_000
	}
	if opts.MaxConcurrent == 0 {
		opts.MaxConcurrent = 10
	}
	if opts.MaxBytesInFrame == 0 {
		opts.MaxBytesInFrame = 1 << 20
	}
	h := remote.NewReadHandler(logger, reg, readQueryable{r}, func() config.Config { return config.Config{} },
		opts.MaxSamples, opts.MaxConcurrent, opts.MaxBytesInFrame)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if opts.Ready != nil && !opts.Ready() {
			http.Error(w, "service unavailable", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, req)
	})
}

// readQueryable is tenantQueryable for remote read: its series sets fail
// when the data is known to be partial, and it serves chunks too.
type readQueryable struct{ r Reader }

func (q readQueryable) Querier(mint, maxt int64) (promstorage.Querier, error) {
	return completeQuerier{&tenantQuerier{r: q.r, mint: mint, maxt: maxt}}, nil
}

// ChunkQuerier serves streamed remote read: the tenant's series re-encoded
// as XOR chunks (the merged view spans head, bucket blocks and peers, so
// there are no stored chunks to pass through unchanged).
func (q readQueryable) ChunkQuerier(mint, maxt int64) (promstorage.ChunkQuerier, error) {
	return chunkQuerier{completeQuerier{&tenantQuerier{r: q.r, mint: mint, maxt: maxt}}}, nil
}

// ChunkQuerier makes tenantQueryable a SampleAndChunkQueryable, as the
// query API's constructor requires; that API reads samples only.
func (q tenantQueryable) ChunkQuerier(mint, maxt int64) (promstorage.ChunkQuerier, error) {
	return chunkQuerier{&tenantQuerier{r: q.r, mint: mint, maxt: maxt}}, nil
}

// completeQuerier selects series sets that fail on missing data.
type completeQuerier struct{ *tenantQuerier }

func (q completeQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	return &completeSet{SeriesSet: q.tenantQuerier.Select(ctx, sortSeries, hints, ms...)}
}

// completeSet turns warnings that mean missing data into its error. They
// are checked after the first Next, when a merge has opened every source
// (a peer down or a block not fetched is known by then, before anything is
// written), and at the end (a peer that failed mid-stream); not for every
// series, as a merge's Warnings merges the maps of all its sources.
type completeSet struct {
	promstorage.SeriesSet
	started bool
	err     error
}

func (s *completeSet) Next() bool {
	if s.err != nil {
		return false
	}
	more := s.SeriesSet.Next()
	if !s.started || !more {
		s.started = true
		s.err = MissingData(s.Warnings())
		if s.err != nil {
			return false
		}
	}
	return more
}

func (s *completeSet) Err() error {
	if err := s.SeriesSet.Err(); err != nil {
		return err
	}
	return s.err
}

// ErrPartialData marks an answer known to lack data.
var ErrPartialData = errors.New("partial data")

// MissingData returns an error wrapping ErrPartialData if ws says that data
// is missing, nil otherwise. PromQL's own annotations (warnings and infos
// about the query and its input, such as "possible non-counter") do not:
// they wrap annotations.PromQLWarning or PromQLInfo. Every other annotation
// does. The only ones storage produces are errors of secondary queriers
// that a merge turned into warnings (Prometheus' best-effort secondaries):
// a peer unavailable (peers), a bucket block not fetched (bucketstore), and
// pushdown's unavailable shard. A shard's own annotations arrive marked as
// PromQL ones, which is right: a shard evaluates over its local data only,
// which has no secondaries.
func MissingData(ws annotations.Annotations) error {
	var msgs []string
	for _, w := range ws {
		if errors.Is(w, annotations.PromQLWarning) || errors.Is(w, annotations.PromQLInfo) {
			continue
		}
		msgs = append(msgs, w.Error())
	}
	if len(msgs) == 0 {
		return nil
	}
	slices.Sort(msgs) // ws is a map: one stable message
	return fmt.Errorf("%w: %s", ErrPartialData, strings.Join(msgs, "; "))
}

type chunkQuerier struct{ q promstorage.Querier }

func (c chunkQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.ChunkSeriesSet {
	return promstorage.NewSeriesSetToChunkSet(c.q.Select(ctx, sortSeries, hints, ms...))
}

func (c chunkQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return c.q.LabelValues(ctx, name, hints, ms...)
}

func (c chunkQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return c.q.LabelNames(ctx, hints, ms...)
}

func (c chunkQuerier) Close() error { return c.q.Close() }
