package forward

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestJitterDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   float64
		want float64
	}{
		{"unset means the default, not off", 0, DefaultJitter},
		{"explicit fraction", 0.25, 0.25},
		{"out of range", 1, DefaultJitter},
		{"off", NoJitter, NoJitter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Jitter: tc.in}
			o.defaults()
			require.Equal(t, tc.want, o.Jitter)
			o.defaults() // idempotent: off stays off
			require.Equal(t, tc.want, o.Jitter)

			a := AuthorizerOptions{Jitter: tc.in}
			a.defaults()
			require.Equal(t, min(tc.want, a.RenewAt/2), a.Jitter)
		})
	}
	// A configuration file's 0 is explicit (its defaults apply before
	// decoding), so it becomes NoJitter; anything else passes unchanged.
	require.Equal(t, NoJitter, JitterOption(0))
	require.Equal(t, 0.1, JitterOption(0.1))
	require.Equal(t, 0.1, JitterOption(DefaultFileConfig().Gathering.Jitter), "the file's default keeps jitter on")
	require.Equal(t, 0.1, JitterOption(DefaultFileConfig().Authorize.Jitter))
}

// runWaits runs a Forwarder with opts until it has waited n times between
// collections and returns those waits (the first is the start delay).
func runWaits(t *testing.T, opts Options, n int) []time.Duration {
	t.Helper()
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	recv := newFakeReceiver(t)
	var waits []time.Duration
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts.sleep = func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d) // Run's goroutine only
		if len(waits) == n {
			cancel()
		}
		return ctx.Err()
	}
	h := newHarness(t, prom.URL, recv, t.TempDir(), opts, FederateOptions{})
	require.NoError(t, h.f.Run(ctx))
	require.Len(t, waits, n)
	return waits
}

// The zero Options spread collections by ±10 %, and the first starts after
// a random [0, 10 %) of the interval (issue 20: the zero value was "off").
func TestRunJitterByDefault(t *testing.T) {
	const interval = 10 * time.Second
	waits := runWaits(t, Options{Interval: interval}, 40)
	require.GreaterOrEqual(t, waits[0], time.Duration(0))
	require.Less(t, waits[0], interval/10)
	lo, hi := waits[1], waits[1]
	for _, d := range waits[1:] {
		require.GreaterOrEqual(t, d, interval*9/10)
		require.LessOrEqual(t, d, interval*11/10)
		lo, hi = min(lo, d), max(hi, d)
	}
	// 39 uniform waits over ±10 % all within 2 % of each other: p < 1e-25.
	require.Greater(t, hi-lo, interval/10, "waits are spread, not fixed")
	require.Less(t, lo, interval*97/100)
	require.Greater(t, hi, interval*103/100)
}

func TestRunNoJitter(t *testing.T) {
	const interval = 10 * time.Second
	waits := runWaits(t, Options{Interval: interval, Jitter: NoJitter}, 5)
	require.Equal(t, []time.Duration{0, interval, interval, interval, interval}, waits)
}

func TestRetryAfterStretched(t *testing.T) {
	f := New(discardLogger(), nil, nil, Policy{}, openTestQueue(t, t.TempDir(), QueueOptions{}), nil, Options{})
	seen := map[time.Duration]bool{}
	for range 50 {
		d := stretch(10*time.Second, f.jitter())
		require.GreaterOrEqual(t, d, 10*time.Second, "never earlier than the server asked")
		require.Less(t, d, 11*time.Second)
		seen[d] = true
	}
	require.Greater(t, len(seen), 40, "forwarders told the same Retry-After do not retry together")

	off := New(discardLogger(), nil, nil, Policy{}, openTestQueue(t, t.TempDir(), QueueOptions{}), nil, Options{Jitter: NoJitter, MinBackoff: time.Second, MaxBackoff: 8 * time.Second})
	require.Zero(t, off.jitter())
	for attempt, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		require.Equal(t, want, off.backoff(attempt))
	}
	require.Equal(t, 8*time.Second, off.backoff(100))
}

// A stopping forwarder does not wait out its start delay before the last
// delivery of its backlog.
func TestRunStopsDuringStartDelay(t *testing.T) {
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	recv := newFakeReceiver(t)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{Interval: time.Hour, Jitter: 0.5, sleep: Sleep}, FederateOptions{})
	require.NoError(t, h.f.Collect(context.Background())) // a backlog
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.f.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run waited for its start delay while stopping")
	}
	require.Len(t, recv.series(), 224, "the backlog was flushed at shutdown")
}
