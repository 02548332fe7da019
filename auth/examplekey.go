package auth

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
)

// examplePublicKey is the public half of the repository's example signing
// key (deploy/kubernetes/example-secrets/receiver-keys/ed25519-example.pem):
// its private half is public, so whoever reads the repository can sign
// credentials that a receiver using it accepts.
var examplePublicKey, _ = hex.DecodeString("91a973e1da7572edf3181004305986c73bfba43aeb1eaff7fbd44c35ed7483ef")

// ExampleKeys returns the kids of the keys that are the repository's example
// key: for a warning, as a trial may use it and a fleet must not.
func (ks *KeySet) ExampleKeys() []string {
	var kids []string
	for _, k := range ks.keys {
		if bytes.Equal(k.private.Public().(ed25519.PublicKey), examplePublicKey) {
			kids = append(kids, k.kid)
		}
	}
	return kids
}
