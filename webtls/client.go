package webtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"
)

// ClientConfig is the TLS side of an HTTP client: the CAs that verify the
// server and, optionally, a client certificate for servers that require one
// (mTLS). The field names are those of Prometheus' tls_config, so a YAML
// block of ours reads like a Prometheus one. The zero value verifies the
// server against the system roots and presents no certificate.
type ClientConfig struct {
	// CAFile is a PEM bundle of the CAs to trust; empty: the system roots.
	// NewRoundTripper's transports re-read it when it changes on disk.
	CAFile string `yaml:"ca_file,omitempty"`
	// CertFile and KeyFile are the client certificate and its key (PEM):
	// both or neither. They are re-read when either file changes on disk.
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
	// ServerName overrides the name the server's certificate must carry
	// (by default the host of the URL).
	ServerName string `yaml:"server_name,omitempty"`
	// InsecureSkipVerify turns server verification off. For tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify,omitempty"`
}

// Validate reports every problem of c, each naming its YAML field: a
// certificate without a key or the reverse, a file that cannot be read, a
// CA file without a PEM certificate, a key pair that does not load.
// Callers prefix the path of the block (`peers.tls_config: ...`).
func (c ClientConfig) Validate() error {
	_, err := c.TLSConfig()
	return err
}

// TLSConfig builds the client's *tls.Config: TLS 1.2 at least, RootCAs
// from CAFile (nil, i.e. the system roots, when empty) and, when CertFile
// and KeyFile are set, the key pair loaded now (so a bad pair fails at
// start) and re-loaded when either file changes, so a rotated certificate
// is presented without a restart; mid-rotation the last good pair is kept.
// Every problem is reported, not only the first.
func (c ClientConfig) TLSConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // InsecureSkipVerify is the caller's explicit choice.
	var errs []error
	if c.CAFile != "" {
		pool, err := LoadCAFile(c.CAFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("ca_file: %w", err))
		}
		cfg.RootCAs = pool
	}
	switch {
	case c.CertFile != "" && c.KeyFile != "":
		get, err := ClientCertificate(c.CertFile, c.KeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("cert_file/key_file: %w", err))
		}
		cfg.GetClientCertificate = get
	case c.CertFile != "":
		errs = append(errs, errors.New("cert_file: needs key_file"))
	case c.KeyFile != "":
		errs = append(errs, errors.New("key_file: needs cert_file"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// NewRoundTripper returns a clone of http.DefaultTransport (proxy
// settings, timeouts, HTTP/2) that uses c.TLSConfig() and re-reads CAFile
// when it changes on disk (CAFileTransport, which logs to logger).
func (c ClientConfig) NewRoundTripper(logger *slog.Logger) (http.RoundTripper, error) {
	cfg, err := c.TLSConfig()
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return CAFileTransport(tr, c.CAFile, logger)
}

// LoadCAFile reads a PEM bundle of CA certificates into a pool. It fails
// if the file cannot be read or holds no certificate.
func LoadCAFile(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s: no PEM certificate found", file)
	}
	return pool, nil
}

// ClientCertificate returns a tls.Config.GetClientCertificate that presents
// the key pair in certFile and keyFile. The pair is loaded now, so a bad
// pair fails here, and re-loaded when either file's modification time
// changes; if a re-load fails (a rotation half done), the last good pair is
// presented.
func ClientCertificate(certFile, keyFile string) (func(*tls.CertificateRequestInfo) (*tls.Certificate, error), error) {
	cc := &certCache{certFile: certFile, keyFile: keyFile}
	if _, err := cc.get(); err != nil {
		return nil, err
	}
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cc.get() }, nil
}

// certCache holds a key pair and the modification times it was loaded at.
type certCache struct {
	certFile, keyFile string

	mu                sync.Mutex
	cert              *tls.Certificate
	certTime, keyTime time.Time
}

func (c *certCache) get() (*tls.Certificate, error) {
	ci, err := os.Stat(c.certFile)
	if err != nil {
		return c.keep(fmt.Errorf("client certificate: %w", err))
	}
	ki, err := os.Stat(c.keyFile)
	if err != nil {
		return c.keep(fmt.Errorf("client key: %w", err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && ci.ModTime().Equal(c.certTime) && ki.ModTime().Equal(c.keyTime) {
		return c.cert, nil
	}
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		if c.cert != nil { // mid-rotation: keep the last good pair
			return c.cert, nil
		}
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	c.cert, c.certTime, c.keyTime = &pair, ci.ModTime(), ki.ModTime()
	return c.cert, nil
}

// keep returns the last good pair when there is one (a file briefly gone
// while it is replaced), else err.
func (c *certCache) keep(err error) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil {
		return c.cert, nil
	}
	return nil, err
}
