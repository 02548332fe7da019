package limits

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRetryAfterOfAVeryLowRateDoesNotOverflow: a wait too long for a
// time.Duration in nanoseconds is capped, not wrapped around to 1s.
func TestRetryAfterOfAVeryLowRateDoesNotOverflow(t *testing.T) {
	var cfg Config
	rate, burst := 1e-9, 10
	cfg.Defaults.SamplesPerSecondPerCluster = &rate
	cfg.Defaults.BurstPerCluster = &burst
	cfg.SetDefaults()
	now := time.Unix(1000, 0)
	l := New(nil, cfg, func() time.Time { return now })
	_, err := l.AllowSamples("t", "c", 10)
	require.NoError(t, err)
	retry, err := l.AllowSamples("t", "c", 10)
	require.ErrorIs(t, err, ErrRateLimited)
	require.Equal(t, time.Duration(math.MaxInt32)*time.Second, retry)
	retry, err = l.CheckExhausted("t", "c")
	require.ErrorIs(t, err, ErrRateLimited)
	require.Equal(t, time.Duration(math.MaxInt32)*time.Second, retry)
}
