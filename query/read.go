package query

import (
	"context"
	"log/slog"
	"net/http"

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
// remote-read client sees what the query API sees. reg may be nil.
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
	h := remote.NewReadHandler(logger, reg, tenantQueryable{r}, func() config.Config { return config.Config{} },
		opts.MaxSamples, opts.MaxConcurrent, opts.MaxBytesInFrame)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if opts.Ready != nil && !opts.Ready() {
			http.Error(w, "service unavailable", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, req)
	})
}

// ChunkQuerier serves streamed remote read: the tenant's series re-encoded
// as XOR chunks (the merged view spans head, bucket blocks and peers, so
// there are no stored chunks to pass through unchanged).
func (q tenantQueryable) ChunkQuerier(mint, maxt int64) (promstorage.ChunkQuerier, error) {
	return chunkQuerier{&tenantQuerier{r: q.r, mint: mint, maxt: maxt}}, nil
}

type chunkQuerier struct{ q *tenantQuerier }

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
