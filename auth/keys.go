package auth

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/phonehome/phonehome/internal/strictyaml"
)

// KeysFile is the on-disk format of the signing keys file. Several keys may
// be listed: any of them verifies, and the newest whose `created` has passed
// signs, decided at each signing. A key is rotated without a restart: add
// the new one with a `created` further ahead than it takes every replica to
// re-read the file (FileKeys), so that all switch to it at that time; remove
// the old one once a credential lifetime has passed since. If no key's
// `created` has passed yet, the oldest signs: a clock or a typo never leaves
// a receiver without a signer. Every receiver replica must read the same file.
//
//	keys:
//	  - kid: 2026-11
//	    created: 2026-11-01T00:00:00Z
//	    private_key_file: ed25519-2026-11.pem   # PKCS#8 PEM, `openssl genpkey -algorithm ed25519`
type KeysFile struct {
	Keys []KeyEntry `yaml:"keys"`
}

// KeyEntry is one Ed25519 signing key.
type KeyEntry struct {
	KID            string    `yaml:"kid"`
	Created        time.Time `yaml:"created"`
	PrivateKeyFile string    `yaml:"private_key_file"`
}

// signingKey is a loaded key.
type signingKey struct {
	kid     string
	created time.Time
	private ed25519.PrivateKey
}

// KeySet holds the loaded keys, newest `created` first. Immutable.
type KeySet struct {
	keys []signingKey
	byID map[string]ed25519.PublicKey
}

// KeySource gives the keys in force at each call: a *KeySet (always the
// same) or a *FileKeys (the last valid version of the keys file).
type KeySource interface {
	Current() *KeySet
}

// Current implements KeySource: a KeySet is its own, fixed, source.
func (ks *KeySet) Current() *KeySet { return ks }

// LoadKeysFile reads a keys file and every key it names, reporting every problem.
func LoadKeysFile(path string) (*KeySet, error) {
	ks, _, err := loadKeysFile(path)
	return ks, err
}

// loadKeysFile is LoadKeysFile that also returns a digest of the keys
// (FileKeys: have they changed?).
func loadKeysFile(path string) (*KeySet, [sha256.Size]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("read keys file: %w", err)
	}
	var f KeysFile
	if err := strictyaml.Decode(b, &f); err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("keys file %s: %w", path, err)
	}
	var errs []error
	ks := &KeySet{byID: map[string]ed25519.PublicKey{}}
	if len(f.Keys) == 0 {
		errs = append(errs, errors.New("keys: at least one key is required"))
	}
	for i, e := range f.Keys {
		p := fmt.Sprintf("keys[%d]", i)
		if e.KID == "" {
			errs = append(errs, fmt.Errorf("%s.kid: required", p))
		} else if _, dup := ks.byID[e.KID]; dup {
			errs = append(errs, fmt.Errorf("%s.kid: %q is listed twice", p, e.KID))
		}
		if e.Created.IsZero() {
			errs = append(errs, fmt.Errorf("%s.created: required (RFC 3339), it decides which key signs", p))
		}
		file := e.PrivateKeyFile
		if file != "" && !filepath.IsAbs(file) {
			file = filepath.Join(filepath.Dir(path), file)
		}
		priv, err := readEd25519(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.private_key_file: %w", p, err))
			continue
		}
		ks.keys = append(ks.keys, signingKey{kid: e.KID, created: e.Created, private: priv})
		ks.byID[e.KID] = priv.Public().(ed25519.PublicKey)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("keys file %s: %w", path, err)
	}
	sort.SliceStable(ks.keys, func(i, j int) bool { return ks.keys[i].created.After(ks.keys[j].created) })
	return ks, ks.digest(), nil
}

// digest identifies what the keys do: which kid verifies with which public
// key, and from when each signs. Comments and file layout do not count.
func (ks *KeySet) digest() [sha256.Size]byte {
	h := sha256.New()
	for _, k := range ks.keys {
		fmt.Fprintf(h, "%q %s %x\n", k.kid, k.created.UTC().Format(time.RFC3339Nano), ks.byID[k.kid])
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

func readEd25519(path string) (ed25519.PrivateKey, error) {
	if path == "" {
		return nil, errors.New("required")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse PKCS#8: %w", err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key is %T, want Ed25519", k)
	}
	return priv, nil
}

// signer is the key that signs at now: the newest whose created has
// passed, or, while none has, the oldest. ks has at least one key.
func (ks *KeySet) signer(now time.Time) signingKey {
	for _, k := range ks.keys {
		if !k.created.After(now) {
			return k
		}
	}
	return ks.keys[len(ks.keys)-1]
}

// NoneCreated reports whether no key's created has passed at now, so the
// oldest signs before its time (KeysFile): worth a warning.
func (ks *KeySet) NoneCreated(now time.Time) bool {
	return len(ks.keys) > 0 && ks.keys[len(ks.keys)-1].created.After(now)
}

// NewKeySet builds a KeySet from in-memory keys (tests, tools): newest
// signs, whatever the time.
func NewKeySet(keys map[string]ed25519.PrivateKey, newest string) *KeySet {
	ks := &KeySet{byID: map[string]ed25519.PublicKey{}}
	for kid, k := range keys {
		sk := signingKey{kid: kid, private: k}
		if kid == newest {
			ks.keys = append([]signingKey{sk}, ks.keys...)
		} else {
			ks.keys = append(ks.keys, sk)
		}
		ks.byID[kid] = k.Public().(ed25519.PublicKey)
	}
	return ks
}
