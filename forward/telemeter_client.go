package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"
)

// Helpers for telemeter-client's flags that have no counterpart in our
// federate client: a client certificate towards Prometheus
// (--tls-cert-file, --tls-private-key-file) and an inline bearer token
// (--from-token).

// WithClientCertificate makes client (built by NewHTTPClient) present the
// certificate in certFile and keyFile. The pair is loaded now, so a bad pair
// fails at start, and re-loaded when either file changes on disk, so a
// rotated certificate is picked up without a restart.
func WithClientCertificate(client *http.Client, certFile, keyFile string) error {
	tr, ok := client.Transport.(*http.Transport)
	if !ok {
		return errors.New("client certificate: unexpected transport")
	}
	cc := &certCache{certFile: certFile, keyFile: keyFile}
	if _, err := cc.get(); err != nil {
		return err
	}
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tr.TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return cc.get()
	}
	return nil
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
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	ki, err := os.Stat(c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("client key: %w", err)
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

// WithBearerToken makes client send token as a bearer token on every
// request that carries no Authorization header of its own.
func WithBearerToken(client *http.Client, token string) {
	next := client.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	client.Transport = bearerTransport{next: next, value: "Bearer " + token}
}

type bearerTransport struct {
	next  http.RoundTripper
	value string
}

func (b bearerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Authorization") != "" {
		return b.next.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	r.Header.Set("Authorization", b.value)
	return b.next.RoundTrip(r)
}

// StaticToken is an inline bearer token (telemeter-client's --to-token).
// It implements Credentials.
type StaticToken string

// Token implements Credentials.
func (t StaticToken) Token(context.Context) (string, error) { return string(t), nil }

// Rejected implements Credentials: asking again yields the same token.
func (StaticToken) Rejected(string) bool { return false }
