package push

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

func TestRateKeyIgnoresHeaderFormatting(t *testing.T) {
	k := rateKey("acme", "Bearer s3cret")
	for _, h := range []string{"bearer s3cret", "Bearer   s3cret", "BEARER\ts3cret", " Bearer s3cret "} {
		require.Equal(t, k, rateKey("acme", h), h)
	}
	require.NotEqual(t, k, rateKey("other", "Bearer s3cret"), "tenants never share a bucket")
	require.NotEqual(t, k, rateKey("acme", "Bearer other"))
}

func TestLimiterEvictsRefilledBucketsFirst(t *testing.T) {
	l := newLimiter(RateLimit{RequestsPerSecond: 1, Burst: 1})
	now := time.Unix(0, 0)
	ok, _ := l.allow("busy", now)
	require.True(t, ok)
	for i := range maxLimiters - 1 {
		l.m[fmt.Sprint("idle-", i)] = rate.NewLimiter(l.r, l.burst) // full: as good as new
	}
	l.evict(now)
	require.Contains(t, l.m, "busy", "a bucket still refilling is kept")
	require.Len(t, l.m, 1, "refilled buckets are dropped")
	ok, _ = l.allow("busy", now)
	require.False(t, ok, "and still limits")
}
