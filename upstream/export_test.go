package upstream

import (
	"context"
	"time"
)

// NoBackoff makes retries immediate (tests).
func (w *Writer) NoBackoff() {
	w.sleep = func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
}
