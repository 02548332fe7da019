// Package periodic runs a function at a fixed interval: the receiver's
// file reloads, peer checks and probes share it.
package periodic

import (
	"context"
	"time"
)

// Every calls f every d, the first time d after it is called, until ctx
// ends. A call that overruns d delays the next one; ticks are not queued.
func Every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f(ctx)
	}
}
