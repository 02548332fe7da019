package periodic

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every calls f until ctx ends, then returns.
func TestEveryCallsUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	done := make(chan struct{})
	go func() {
		Every(ctx, time.Millisecond, func(context.Context) {
			if calls++; calls == 3 {
				cancel()
			}
		})
		close(done)
	}()
	<-done
	require.Equal(t, 3, calls)
}
