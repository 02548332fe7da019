package storage

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestJitteredShipWaits(t *testing.T) {
	lo, hi := time.Hour, time.Duration(0)
	for range 200 {
		d := jittered(30 * time.Second)
		require.GreaterOrEqual(t, d, 27*time.Second)
		require.LessOrEqual(t, d, 33*time.Second)
		lo, hi = min(lo, d), max(hi, d)
	}
	require.Greater(t, hi-lo, 3*time.Second, "replicas do not ship in lockstep")
}
