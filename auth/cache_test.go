package auth

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestExpiringCacheEvictsExpiredFirst: a full cache makes room from the
// expired entries before it drops live ones, and never exceeds its bound.
func TestExpiringCacheEvictsExpiredFirst(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	key := func(i int) [sha256.Size]byte { return sha256.Sum256(fmt.Append(nil, i)) }
	c := expiringCache[int]{max: 8}
	for i := range 8 {
		c.put(key(i), i, now.Add(time.Duration(i%2+1)*time.Minute), now) // odd ones live longer
	}
	now = now.Add(time.Minute) // the even ones expire
	c.put(key(8), 8, now.Add(time.Minute), now)
	require.Equal(t, 5, c.len())
	for i := 1; i <= 8; i += 2 {
		v, _, ok := c.get(key(i), now)
		require.True(t, ok, i)
		require.Equal(t, i, v)
	}
	_, _, ok := c.get(key(0), now)
	require.False(t, ok)

	for i := range 100 {
		c.put(key(100+i), i, now.Add(time.Hour), now)
		require.LessOrEqual(t, c.len(), 8)
	}
	c.remove(key(199))
	_, _, ok = c.get(key(199), now)
	require.False(t, ok)

	off := expiringCache[int]{}
	off.put(key(1), 1, now.Add(time.Hour), now)
	require.Zero(t, off.len(), "max 0 remembers nothing")
}
