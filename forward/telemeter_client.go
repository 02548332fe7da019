package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"

	"github.com/phonehome/phonehome/webtls"
)

// Helpers for telemeter-client's flags that have no counterpart in our
// federate client: a client certificate towards Prometheus
// (--tls-cert-file, --tls-private-key-file) and an inline bearer token
// (--from-token).

// WithClientCertificate makes client (built by NewHTTPClient) present the
// certificate in certFile and keyFile. The pair is loaded now, so a bad pair
// fails at start, and re-loaded when either file changes on disk, so a
// rotated certificate is picked up without a restart (webtls.ClientCertificate).
func WithClientCertificate(client *http.Client, certFile, keyFile string) error {
	tr, ok := client.Transport.(*http.Transport)
	if !ok {
		return errors.New("client certificate: unexpected transport")
	}
	get, err := webtls.ClientCertificate(certFile, keyFile)
	if err != nil {
		return err
	}
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tr.TLSClientConfig.GetClientCertificate = get
	return nil
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
