package storage

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAggrChunkMalformedCountsNoSamples: a corrupt aggregate chunk in a
// bucket block counts no samples (the rewrite then fails, naming the
// block) rather than panicking the receiver, which would crash-loop on the
// resumed erasure.
func TestAggrChunkMalformedCountsNoSamples(t *testing.T) {
	for name, b := range map[string][]byte{
		"length that wraps":      append(binary.AppendUvarint(nil, ^uint64(0)), 1, 0, 0),
		"length past the end":    append(binary.AppendUvarint(nil, 10), 1, 0, 0),
		"one-byte XOR chunk":     {1, 1, 0},
		"empty":                  {},
		"only absent aggregates": {0, 0, 0, 0, 0},
	} {
		require.NotPanics(t, func() {
			require.Zero(t, (&aggrChunk{b: b}).NumSamples(), name)
		}, name)
	}
}
