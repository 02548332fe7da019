package bucketstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestJitteredSyncWaits(t *testing.T) {
	lo, hi := time.Hour, time.Duration(0)
	for range 200 {
		d := jittered(time.Minute)
		require.GreaterOrEqual(t, d, 54*time.Second)
		require.LessOrEqual(t, d, 66*time.Second)
		lo, hi = min(lo, d), max(hi, d)
	}
	require.Greater(t, hi-lo, 6*time.Second, "replicas do not sync in lockstep")
}
