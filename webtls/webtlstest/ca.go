// Package webtlstest makes certificate authorities and certificates for
// tests: real TLS on loopback, with no file checked in and nothing that
// expires between two runs.
package webtlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CA is a certificate authority made for one test.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate as a PEM file (for ca_file, client_ca_file, --to-ca-file).
	File string
	dir  string
}

// NewCA makes a CA named name whose files live in t.TempDir().
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	dir := t.TempDir()
	ca := &CA{Cert: cert, key: key, File: filepath.Join(dir, name+"-ca.pem"), dir: dir}
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Pool returns a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Server issues a server certificate for 127.0.0.1, ::1 and localhost and
// writes it and its key as name.pem and name-key.pem.
func (ca *CA) Server(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageServerAuth)
}

// Client issues a client certificate with common name name.
func (ca *CA) Client(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageClientAuth)
}

// ServerTo issues a server certificate as Server does, writing it over
// certFile and keyFile (a rotation, for reload tests).
func (ca *CA) ServerTo(t testing.TB, name, certFile, keyFile string) {
	t.Helper()
	c, k := ca.issue(t, name, x509.ExtKeyUsageServerAuth)
	for _, p := range [][2]string{{c, certFile}, {k, keyFile}} {
		b, err := os.ReadFile(p[0])
		require.NoError(t, err)
		ReplaceFile(t, p[1], b)
	}
}

// PEM returns the CA certificate in PEM, as File holds it: a part of a
// bundle.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// replaced counts ReplaceFile's calls: each sets a later modification time.
var replaced atomic.Int64

// ReplaceFile writes content over path as the kubelet updates a mounted
// Secret or ConfigMap: a new file renamed into place. Its modification time
// is later than any ReplaceFile set before, so a reader that watches it
// sees the change even where file times are coarse.
func ReplaceFile(t testing.TB, path string, content []byte) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, content, 0o600))
	mod := time.Now().Add(time.Duration(replaced.Add(1)) * time.Second)
	require.NoError(t, os.Chtimes(tmp, mod, mod))
	require.NoError(t, os.Rename(tmp, path))
}

// ClientPair issues a client certificate as Client does and returns it
// loaded, for a tls.Config's Certificates.
func (ca *CA) ClientPair(t testing.TB, name string) tls.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(ca.Client(t, name))
	require.NoError(t, err)
	return pair
}

func (ca *CA) issue(t testing.TB, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	require.NoError(t, err)
	return n
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}
