package forward

import (
	"context"
	"net/http"
)

// WithBearerToken makes client send token as a bearer token on every
// request that carries no Authorization header of its own (telemeter-client's
// inline --from-token, which our federate client has no counterpart for).
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

// CloseIdleConnections lets http.Client.CloseIdleConnections reach next.
func (b bearerTransport) CloseIdleConnections() {
	if c, ok := b.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// StaticToken is an inline bearer token (telemeter-client's --to-token).
// It implements Credentials.
type StaticToken string

// Token implements Credentials.
func (t StaticToken) Token(context.Context) (string, error) { return string(t), nil }

// Rejected implements Credentials: asking again yields the same token.
func (StaticToken) Rejected(string) bool { return false }
