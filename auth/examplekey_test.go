package auth

import (
	"crypto/ed25519"
	"testing"

	"github.com/stretchr/testify/require"
)

// The repository's example key is recognised (its private half is public);
// a key of one's own is not.
func TestExampleKeys(t *testing.T) {
	ks, err := LoadKeysFile("../deploy/kubernetes/example-secrets/receiver-keys/keys.yaml")
	require.NoError(t, err)
	require.Equal(t, []string{"example-2026-11"}, ks.ExampleKeys())

	own := NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k")
	require.Empty(t, own.ExampleKeys())
}
