package auth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
)

// sealedIDInfo is the HKDF info of the key that seals raw cluster ids in
// credentials: it keeps that key apart from any other use of the
// cluster_id_hash secret (the pseudonyms are HMACs keyed with it directly).
const sealedIDInfo = "phonehome cluster credential: sealed raw cluster id v1"

// errSealedID refuses a credential whose sealed raw id does not open: it
// was issued under another cluster_id_hash key (or by a receiver with one,
// where this one has none). The cluster authorizes again and gets a
// credential for its pseudonym under the key in force.
var errSealedID = fmt.Errorf("credential's sealed cluster id does not open with this receiver's auth.cluster_id_hash key: %w", ErrUnauthorized)

// idSealer seals a cluster's raw id into its credential, so that writes
// with the credential can rewrite the raw id wherever a series carries it,
// as the Telemeter bearer path does with the id its bearer carries in
// clear. Anyone who only sees the credential (a log, a proxy) cannot read
// it. AES-256-GCM with random nonces: at most 2^32 seals per key, one per
// credential issued to a cluster that sends its raw id (a fleet of 100,000
// renewing every hour takes five years; a nonce collision would expose
// two raw ids, never allow a forgery: the credential is signed).
type idSealer struct{ aead cipher.AEAD }

// newIDSealer derives the sealing key from the cluster_id_hash secret.
func newIDSealer(secret []byte) (*idSealer, error) {
	key, err := hkdf.Key(sha256.New, secret, nil, sealedIDInfo, 32)
	if err != nil {
		return nil, fmt.Errorf("derive the sealing key: %w", err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("sealing cipher: %w", err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, fmt.Errorf("sealing cipher: %w", err)
	}
	return &idSealer{aead: aead}, nil
}

// seal returns raw sealed for the credential of stored (the pseudonym it
// binds, authenticated with it so that a sealed id opens only in a
// credential for that pseudonym), in base64url.
func (s *idSealer) seal(raw, stored string) string {
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nil, nil, []byte(raw), []byte(stored)))
}

// open returns the raw id seal sealed for stored.
func (s *idSealer) open(sealed, stored string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(sealed)
	if err != nil {
		return "", errors.New("not base64url")
	}
	raw, err := s.aead.Open(nil, nil, b, []byte(stored))
	if err != nil {
		return "", err // "cipher: message authentication failed", never the id
	}
	return string(raw), nil
}
