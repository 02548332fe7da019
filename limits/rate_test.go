package limits

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// rateOnly limits only the per-cluster rate (or the tenant rate, if tenant).
func rateSpec(perSec float64, burst int, tenantPerSec float64, tenantBurst int) Config {
	return Config{Defaults: Spec{
		SamplesPerSecondPerCluster: ptr(perSec), BurstPerCluster: ptr(burst),
		SamplesPerSecondPerTenant: ptr(tenantPerSec), BurstPerTenant: ptr(tenantBurst),
	}}
}

func TestRateAtUnderOver(t *testing.T) {
	// The bucket holds 50 tokens after draining 100 and waiting 5s at 10/s.
	for _, tc := range []struct {
		name string
		n    int
		ok   bool
	}{
		{"under", 49, true},
		{"at", 50, true},
		{"over", 51, false},
	} {
		for _, scope := range []string{"cluster", "tenant"} {
			t.Run(scope+"/"+tc.name, func(t *testing.T) {
				clk := newClock()
				cfg := rateSpec(10, 100, 0, 0)
				limit := LimitSamplesPerSecondCluster
				if scope == "tenant" {
					cfg = rateSpec(0, 0, 10, 100)
					limit = LimitSamplesPerSecondTenant
				}
				reg := prometheus.NewRegistry()
				l := New(reg, cfg, clk.Now)
				_, err := l.AllowSamples("t", "c", 100)
				require.NoError(t, err, "the bucket starts full")
				clk.Advance(5 * time.Second)
				retry, err := l.AllowSamples("t", "c", tc.n)
				if tc.ok {
					require.NoError(t, err)
					require.Zero(t, retry)
					return
				}
				require.Equal(t, &LimitError{Limit: limit, Value: 10}, err)
				require.ErrorIs(t, err, ErrRateLimited)
				require.Equal(t, limit+" limit of 10 reached", err.Error())
				require.Equal(t, time.Second, retry, "0.1s short, rounded up to 1s")
				require.Equal(t, 1.0, rejected(t, reg, limit))
			})
		}
	}
}

func TestRateBurstRefillRetryAfter(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 0, 0), clk.Now)

	_, err := l.AllowSamples("t", "c", 60)
	require.NoError(t, err)
	_, err = l.AllowSamples("t", "c", 40)
	require.NoError(t, err, "a full burst passes at once")

	retry, err := l.AllowSamples("t", "c", 35)
	require.Error(t, err)
	require.Equal(t, 4*time.Second, retry, "35 tokens at 10/s: 3.5s, rounded up")

	clk.Advance(3 * time.Second)
	retry, err = l.AllowSamples("t", "c", 35)
	require.Error(t, err)
	require.Equal(t, time.Second, retry, "5 short: 0.5s, rounded up to 1s")

	clk.Advance(500 * time.Millisecond)
	_, err = l.AllowSamples("t", "c", 35)
	require.NoError(t, err, "refilled after exactly the announced wait")

	clk.Advance(time.Hour)
	_, err = l.AllowSamples("t", "c", 100)
	require.NoError(t, err, "refill stops at the burst")
	_, err = l.AllowSamples("t", "c", 1)
	require.Error(t, err)
}

func TestRateRefusedConsumesNothing(t *testing.T) {
	clk := newClock()
	// Cluster buckets 100 each; the tenant bucket 150 shared.
	l := New(nil, rateSpec(10, 100, 10, 150), clk.Now)
	_, err := l.AllowSamples("t", "c1", 100)
	require.NoError(t, err) // c1: 0 left, tenant: 50 left

	for range 10 {
		retry, err := l.AllowSamples("t", "c2", 60)
		require.ErrorIs(t, err, ErrRateLimited)
		require.Equal(t, LimitSamplesPerSecondTenant, limitOf(t, err))
		require.Equal(t, time.Second, retry)
	}
	for range 10 {
		_, err := l.AllowSamples("t", "c1", 30)
		require.Equal(t, LimitSamplesPerSecondCluster, limitOf(t, err))
	}
	// Nothing was taken by the refusals: the tenant still holds 50, c2 100.
	_, err = l.AllowSamples("t", "c2", 50)
	require.NoError(t, err)
	_, err = l.AllowSamples("t", "c2", 1)
	require.Equal(t, LimitSamplesPerSecondTenant, limitOf(t, err))
	clk.Advance(5 * time.Second) // tenant +50, c2 50+50
	_, err = l.AllowSamples("t", "c2", 50)
	require.NoError(t, err)
}

func TestRateRetryAfterIsTheLongerWait(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 1, 100), clk.Now)
	_, err := l.AllowSamples("t", "c", 100)
	require.NoError(t, err)
	clk.Advance(2 * time.Second) // cluster 20, tenant 2
	retry, err := l.AllowSamples("t", "c", 30)
	require.Equal(t, LimitSamplesPerSecondTenant, limitOf(t, err))
	require.Equal(t, 28*time.Second, retry, "tenant needs 28 more at 1/s; the cluster only 1s")
}

func TestRateLargerThanBurstIsTooLarge(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 0, 0), clk.Now)
	_, err := l.AllowSamples("t", "c", 101)
	require.ErrorIs(t, err, ErrTooLarge, "more than a full bucket can never be paid for")
	require.Equal(t, &LimitError{Limit: LimitBurstPerCluster, Value: 100}, err)
	_, err = l.AllowSamples("t", "c", 100)
	require.NoError(t, err, "and it took nothing")
}

func TestRateUnlimited(t *testing.T) {
	l := New(nil, rateSpec(0, 0, 0, 0), newClock().Now)
	for range 3 {
		retry, err := l.AllowSamples("t", "c", 1<<30)
		require.NoError(t, err)
		require.Zero(t, retry)
	}
	_, err := l.AllowSamples("t", "c", 0)
	require.NoError(t, err)
}

func TestRateHotReload(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 0, 0), clk.Now)
	_, err := l.AllowSamples("t", "c", 100)
	require.NoError(t, err)

	l.Reload(rateSpec(100, 1000, 0, 0)) // the bucket keeps its level (0), refills faster
	clk.Advance(time.Second)
	_, err = l.AllowSamples("t", "c", 100)
	require.NoError(t, err)
	_, err = l.AllowSamples("t", "c", 1)
	require.Error(t, err)

	clk.Advance(10 * time.Second)
	_, err = l.AllowSamples("t", "c", 1000)
	require.NoError(t, err, "the raised burst applies")

	l.Reload(rateSpec(1, 5, 0, 0))
	clk.Advance(time.Hour)
	_, err = l.AllowSamples("t", "c", 5)
	require.NoError(t, err)
	retry, err := l.AllowSamples("t", "c", 3)
	require.Error(t, err, "the lowered burst caps the refill")
	require.Equal(t, 3*time.Second, retry)

	l.Reload(rateSpec(0, 0, 0, 0))
	_, err = l.AllowSamples("t", "c", 1000)
	require.NoError(t, err, "0 = unlimited takes effect at once")
}

func TestRateIdleBucketsCollected(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 10, 1000), clk.Now)
	for _, c := range []string{"a", "b", "c"} {
		_, err := l.AllowSamples("t", c, 50)
		require.NoError(t, err)
	}
	tn := l.tenant("t")
	require.Len(t, tn.clusterRates, 3)
	clk.Advance(4 * time.Second)
	_, err := l.AllowSamples("t", "a", 1)
	require.NoError(t, err)
	l.Expire()
	require.Len(t, tn.clusterRates, 3, "not yet refilled")
	clk.Advance(time.Second)
	l.Expire()
	require.Len(t, tn.clusterRates, 1, "b and c refilled; a took one more")
	clk.Advance(time.Second)
	l.Expire()
	require.Empty(t, tn.clusterRates)
}

func TestRunStopsOnCancel(t *testing.T) {
	l := New(nil, Config{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- l.Run(ctx) }()
	cancel()
	require.NoError(t, <-done)
}

func limitOf(t *testing.T, err error) string {
	t.Helper()
	var le *LimitError
	require.ErrorAs(t, err, &le)
	return le.Limit
}

func TestCheckExhaustedTakesNothing(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 0, 0), clk.Now)
	_, err := l.CheckExhausted("t", "c")
	require.NoError(t, err, "a full bucket")
	_, err = l.AllowSamples("t", "c", 100)
	require.NoError(t, err, "the check took nothing: all 100 are still there")
	_, err = l.CheckExhausted("t", "")
	require.NoError(t, err, "no cluster: only the (unlimited) tenant bucket")
}

// TestCheckExhaustedDoesNotGuessTheWait: on an empty bucket the check before
// the body cannot know how long the request must wait (its size is not
// known), and the time until one sample fits (1s) would only bring the
// client back early. The request is decoded, refused with its real wait,
// and from then on refused before its body until that wait is over.
func TestCheckExhaustedDoesNotGuessTheWait(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(1, 200_000, 0, 0), clk.Now)
	_, err := l.AllowSamples("t", "c", 200_000)
	require.NoError(t, err)
	_, err = l.CheckExhausted("t", "c")
	require.NoError(t, err, "an empty bucket, but nothing refused yet: the request's size decides")
	retry, err := l.AllowSamples("t", "c", 300)
	require.ErrorIs(t, err, ErrRateLimited)
	require.Equal(t, 300*time.Second, retry, "until the 300 samples fit, not until 1 does")
	clk.Advance(time.Second)
	retry, err = l.CheckExhausted("t", "c")
	require.ErrorIs(t, err, ErrRateLimited, "told to wait: refused before the body")
	require.Equal(t, 299*time.Second, retry, "what is left of the wait it was given")
}

func TestCheckExhaustedUntilRefusedRequestFits(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 0, 0), clk.Now)
	_, err := l.AllowSamples("t", "c", 50)
	require.NoError(t, err)
	retry, err := l.AllowSamples("t", "c", 80)
	require.ErrorIs(t, err, ErrRateLimited, "50 left, 80 asked")
	require.Equal(t, 3*time.Second, retry)

	for _, tc := range []struct {
		advance time.Duration
		ok      bool
		why     string
	}{
		{0, false, "under: 50 of the 80 owed, though not empty"},
		{2*time.Second + 900*time.Millisecond, false, "just under: 79 of 80"},
		{100 * time.Millisecond, true, "at: the 80 the refused request needed"},
	} {
		clk.Advance(tc.advance)
		_, err := l.CheckExhausted("t", "c")
		if tc.ok {
			require.NoError(t, err, tc.why)
		} else {
			require.ErrorIs(t, err, ErrRateLimited, tc.why)
		}
	}
	_, err = l.CheckExhausted("t", "other")
	require.NoError(t, err, "another cluster of the tenant owes nothing")

	_, err = l.AllowSamples("t", "c", 80)
	require.NoError(t, err, "paid: nothing owed any more")
	_, err = l.CheckExhausted("t", "c")
	require.NoError(t, err, "after a paid request nothing is refused before its body, even on an empty bucket")
}

func TestCheckExhaustedOwedCappedByReloadedBurst(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 0, 0), clk.Now)
	_, err := l.AllowSamples("t", "c", 100)
	require.NoError(t, err)
	_, err = l.AllowSamples("t", "c", 90)
	require.ErrorIs(t, err, ErrRateLimited)
	l.Reload(rateSpec(10, 20, 0, 0)) // 90 could never fit again
	clk.Advance(2 * time.Second)
	_, err = l.CheckExhausted("t", "c")
	require.NoError(t, err, "owed is capped at the new burst (20), which the bucket holds")
}

func TestCheckExhaustedTenantShortageIsOwed(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 10, 60), clk.Now)
	_, err := l.AllowSamples("t", "a", 50)
	require.NoError(t, err)
	retry, err := l.AllowSamples("t", "b", 20)
	require.ErrorIs(t, err, ErrRateLimited, "the tenant bucket holds 10")
	require.Equal(t, LimitSamplesPerSecondTenant, limitOf(t, err))
	require.Equal(t, time.Second, retry)
	retry, err = l.CheckExhausted("t", "b")
	require.ErrorIs(t, err, ErrRateLimited, "b was told to wait for the tenant bucket")
	require.Equal(t, time.Second, retry)
	_, err = l.CheckExhausted("t", "a")
	require.NoError(t, err, "a was refused nothing")
	clk.Advance(time.Second)
	_, err = l.CheckExhausted("t", "b")
	require.NoError(t, err, "the tenant bucket holds the 20 b needed")
}

func TestCheckExhaustedWithoutClusterOwesOnTheTenantBucket(t *testing.T) {
	clk := newClock()
	l := New(nil, rateSpec(10, 100, 10, 60), clk.Now)
	_, err := l.AllowSamples("t", "", 60)
	require.NoError(t, err)
	_, err = l.CheckExhausted("t", "")
	require.NoError(t, err, "empty, but nothing refused yet")
	retry, err := l.AllowSamples("t", "", 40)
	require.ErrorIs(t, err, ErrRateLimited)
	require.Equal(t, 4*time.Second, retry)
	retry, err = l.CheckExhausted("t", "")
	require.ErrorIs(t, err, ErrRateLimited)
	require.Equal(t, 4*time.Second, retry)
	clk.Advance(4 * time.Second)
	_, err = l.CheckExhausted("t", "")
	require.NoError(t, err)
}
