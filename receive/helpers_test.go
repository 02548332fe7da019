package receive

import (
	"context"
	"log/slog"

	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// discardWriter accepts everything and keeps nothing.
type discardWriter struct{}

func (discardWriter) Write(_ context.Context, _ string, series []prompb.TimeSeries) (storage.Stats, error) {
	var st storage.Stats
	for _, ts := range series {
		st.Samples += len(ts.Samples)
		st.Histograms += len(ts.Histograms)
	}
	return st, nil
}

// newLimiter returns a limiter with the default limits, changed by mod.
func newLimiter(mod func(*limits.Spec)) *limits.Limiter {
	var cfg limits.Config
	if mod != nil {
		mod(&cfg.Defaults)
	}
	cfg.SetDefaults()
	return limits.New(nil, cfg, nil)
}

func ptr[T any](v T) *T { return &v }
