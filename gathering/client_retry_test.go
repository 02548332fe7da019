package gathering

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A failed poll is retried with a short backoff, not a whole interval
// later: a forwarder started while the receiver is unreachable, with no
// cache, would otherwise gather nothing (or its local fallback) for 2h.
func TestRunRetriesAFailedPollBeforeTheInterval(t *testing.T) {
	var mu sync.Mutex
	requests := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		requests++
		n := requests
		mu.Unlock()
		if n == 1 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"version":"v1","selectors":["up"]}`))
	}))
	t.Cleanup(srv.Close)
	got := make(chan string, 1)
	p := NewPoller(discard(), nil, PollerOptions{
		URL: srv.URL, Client: srv.Client(), Interval: time.Hour, RetryMin: time.Millisecond,
		Apply: func(c *Compiled) error { got <- c.Def.Version; return nil },
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	select {
	case v := <-got:
		require.Equal(t, "v1", v)
	case <-time.After(10 * time.Second):
		t.Fatal("the failed poll was not retried before the interval")
	}
}

// The retry wait doubles per consecutive failure from RetryMin, with equal
// jitter, and never exceeds the interval's.
func TestRetryWaitBacksOffUpToTheInterval(t *testing.T) {
	p := NewPoller(discard(), nil, PollerOptions{Interval: time.Hour, RetryMin: time.Minute})
	for failures, want := range []time.Duration{0, time.Minute, 2 * time.Minute, 4 * time.Minute} {
		d := p.wait(failures)
		if failures == 0 {
			require.InDelta(t, float64(time.Hour), float64(d), float64(6*time.Minute)+1)
			continue
		}
		require.GreaterOrEqual(t, d, want/2, "failures %d", failures)
		require.LessOrEqual(t, d, want, "failures %d", failures)
	}
	require.InDelta(t, float64(time.Hour), float64(p.wait(20)), float64(6*time.Minute)+1)
}
