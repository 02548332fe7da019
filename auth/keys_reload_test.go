package auth

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// kidOf returns the kid in a credential's header.
func kidOf(t *testing.T, tok string) string {
	t.Helper()
	hdr, _, _ := strings.Cut(tok, ".")
	raw, err := base64.RawURLEncoding.DecodeString(hdr)
	require.NoError(t, err)
	var h struct{ Kid string }
	require.NoError(t, json.Unmarshal(raw, &h))
	return h.Kid
}

// keysDir writes keys files and their PEMs in a temporary directory.
type keysDir struct {
	t    *testing.T
	dir  string
	keys map[string]ed25519.PrivateKey
}

func newKeysDir(t *testing.T) *keysDir {
	return &keysDir{t: t, dir: t.TempDir(), keys: map[string]ed25519.PrivateKey{}}
}

// pem writes kid's key (made on first use) and returns its file name.
func (d *keysDir) pem(kid string) string {
	d.t.Helper()
	if d.keys[kid] == nil {
		d.keys[kid] = newKey(d.t)
	}
	der, err := x509.MarshalPKCS8PrivateKey(d.keys[kid])
	require.NoError(d.t, err)
	name := kid + ".pem"
	require.NoError(d.t, os.WriteFile(filepath.Join(d.dir, name), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	return name
}

// write writes keys.yaml listing kid=created pairs (created in RFC 3339),
// whole (renamed into place), and returns its path.
func (d *keysDir) write(entries ...string) string {
	d.t.Helper()
	var b strings.Builder
	b.WriteString("keys:\n")
	for _, e := range entries {
		kid, created, _ := strings.Cut(e, "=")
		fmt.Fprintf(&b, "  - {kid: %s, created: %s, private_key_file: %s}\n", kid, created, d.pem(kid))
	}
	return d.writeRaw(b.String())
}

func (d *keysDir) writeRaw(s string) string {
	d.t.Helper()
	p := filepath.Join(d.dir, "keys.yaml")
	require.NoError(d.t, os.WriteFile(p+".tmp", []byte(s), 0o600))
	require.NoError(d.t, os.Rename(p+".tmp", p))
	return p
}

// A key whose created is ahead verifies at once but signs only from then,
// decided at each signing: every replica that has read the file switches at
// that time, without a reload. While no key's created has passed, the
// oldest signs.
func TestIssuerSignsWithNewestCreatedKey(t *testing.T) {
	switchAt := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	now := switchAt.Add(-time.Hour)
	clock := func() time.Time { return now }
	d := newKeysDir(t)
	ks, err := LoadKeysFile(d.write("old=2026-11-01T00:00:00Z", "new="+switchAt.Format(time.RFC3339)))
	require.NoError(t, err)
	iss := NewIssuer(ks, time.Hour, clock)

	tok, _, err := iss.Issue("acme", "c1")
	require.NoError(t, err)
	require.Equal(t, "old", kidOf(t, tok), "the new key's created has not passed: the old one signs")
	require.False(t, ks.NoneCreated(now))

	// Another replica's credential, signed with the new key (its clock a
	// little ahead), verifies here before the switch.
	ahead := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"new": d.keys["new"]}, "new"), time.Hour, clock)
	newTok, _, err := ahead.Issue("acme", "c2")
	require.NoError(t, err)
	id, err := iss.Verify(newTok)
	require.NoError(t, err, "a key not yet signing verifies")
	require.Equal(t, "c2", id.ClusterID)

	now = switchAt
	tok, _, err = iss.Issue("acme", "c1")
	require.NoError(t, err)
	require.Equal(t, "new", kidOf(t, tok), "from its created on, the new key signs: same KeySet, no reload")

	t.Run("every key ahead", func(t *testing.T) {
		d := newKeysDir(t)
		ks, err := LoadKeysFile(d.write("later=2027-02-01T00:00:00Z", "soon=2027-01-01T00:00:00Z"))
		require.NoError(t, err)
		now = switchAt
		require.True(t, ks.NoneCreated(now), "worth the receiver's warning")
		tok, _, err := NewIssuer(ks, time.Hour, clock).Issue("acme", "c1")
		require.NoError(t, err)
		require.Equal(t, "soon", kidOf(t, tok), "the oldest signs until one's created has passed")
	})
}

// FileKeys re-reads the keys file: a valid new version is in force at once
// (a new key verifies and, from its created, signs; a removed key's
// credentials are refused, cached ones included), an invalid one, a file
// without keys included, keeps the previous keys, counted as a failure.
func TestFileKeysReload(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	d := newKeysDir(t)
	p := d.write("k1=2026-11-01T00:00:00Z")
	reg := prometheus.NewRegistry()
	fk, err := NewFileKeys(discardLogger(), reg, p)
	require.NoError(t, err)
	changed := 0
	fk.OnChange = func() { changed++ }
	iss := NewIssuer(fk, time.Hour, func() time.Time { return now })
	failures := func() float64 {
		return testutil.ToFloat64(fk.reloads.WithLabelValues("failure"))
	}
	oldTok, _, err := iss.Issue("acme", "c1")
	require.NoError(t, err)
	_, err = iss.Verify(oldTok) // remembered as verified
	require.NoError(t, err)

	require.NoError(t, fk.Reload())
	require.Zero(t, changed, "an unchanged file is no change")

	for _, bad := range []struct{ file, err string }{
		{"keys: [\n", "keys file"},
		{"keys: []\n", "at least one key is required"}, // a reload never removes the last key
		{"keys:\n  - {kid: k1, created: 2026-11-01T00:00:00Z, private_key_file: missing.pem}\n", "keys[0].private_key_file"},
	} {
		before := failures()
		d.writeRaw(bad.file)
		require.ErrorContains(t, fk.Reload(), bad.err)
		require.Equal(t, before+1, failures(), "counted: %q", bad.file)
		tok, _, err := iss.Issue("acme", "c1")
		require.NoError(t, err, "the previous keys stay in force: %q", bad.file)
		require.Equal(t, "k1", kidOf(t, tok))
		_, err = iss.Verify(oldTok)
		require.NoError(t, err)
	}
	require.Zero(t, changed)

	d.write("k1=2026-11-01T00:00:00Z", "k2=2026-11-30T00:00:00Z")
	require.NoError(t, fk.Reload())
	require.Equal(t, 1, changed, "OnChange: the receiver warns about the new keys")
	tok, _, err := iss.Issue("acme", "c1")
	require.NoError(t, err)
	require.Equal(t, "k2", kidOf(t, tok), "the added key signs")
	_, err = iss.Verify(oldTok)
	require.NoError(t, err, "the old key still verifies")

	d.write("k2=2026-11-30T00:00:00Z")
	require.NoError(t, fk.Reload())
	_, err = iss.Verify(oldTok)
	require.ErrorIs(t, err, ErrUnauthorized, "a removed key's credential is refused, though it verified before")
	_, err = iss.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, 3.0, testutil.ToFloat64(fk.reloads.WithLabelValues("success")), "the start, k2 added, k1 removed")
}
