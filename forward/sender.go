package forward

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
)

// Sender delivers one remote-write request.
//
// Send is safe for concurrent use and does not retain req. An error is
// retryable if errors.As(err, &RetryableError{}) holds; any other error means
// the request was rejected and must not be sent again.
type Sender interface {
	Send(ctx context.Context, req *prompb.WriteRequest) error
}

// EncodedSender is implemented by senders that can post an already encoded
// (snappy-compressed protobuf) request, which the queue stores, without a
// decode/encode round trip. Same error contract as Sender.
type EncodedSender interface {
	SendEncoded(ctx context.Context, body []byte) error
}

// RetryableError marks a failure worth retrying: a network error, a 5xx or a 429.
type RetryableError struct {
	Err error
	// RetryAfter is the server's Retry-After, 0 if absent.
	RetryAfter time.Duration
}

func (e RetryableError) Error() string { return e.Err.Error() }
func (e RetryableError) Unwrap() error { return e.Err }

// HTTPError is a non-2xx response from the receiver, with the start of its body.
type HTTPError struct {
	Code    int
	Message string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("server returned HTTP %d: %s", e.Code, e.Message)
}

// HTTPSenderOptions tunes an HTTPSender.
type HTTPSenderOptions struct {
	// TokenFile, if set, is read before every request (so it can rotate) and
	// sent as a bearer token. Ignored when Credentials is set.
	TokenFile string
	// Credentials, if set, supplies the bearer token (e.g. an Authorizer).
	// A 401 is reported to it and, if it has a new token, the request is
	// retried once; a credential that cannot be obtained, or is rejected
	// again, is a RetryableError, so queued data is kept.
	Credentials Credentials
	UserAgent   string
	// Timeout bounds one request (default 30s).
	Timeout time.Duration
}

// HTTPSender is a Prometheus remote-write 1.0 client.
type HTTPSender struct {
	url    string
	client *http.Client
	opts   HTTPSenderOptions
}

// NewHTTPSender returns a sender that POSTs to <base>/api/v1/write.
func NewHTTPSender(base *url.URL, client *http.Client, opts HTTPSenderOptions) *HTTPSender {
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.Credentials == nil {
		opts.Credentials = TokenFile(opts.TokenFile)
	}
	u := *base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/write"
	return &HTTPSender{url: u.String(), client: client, opts: opts}
}

// EncodeWriteRequest marshals and snappy-compresses req, as remote-write 1.0 sends it.
func EncodeWriteRequest(req *prompb.WriteRequest) ([]byte, error) {
	raw, err := req.Marshal()
	if err != nil {
		return nil, fmt.Errorf("marshal write request: %w", err)
	}
	return snappy.Encode(nil, raw), nil
}

// Send implements Sender.
func (s *HTTPSender) Send(ctx context.Context, req *prompb.WriteRequest) error {
	body, err := EncodeWriteRequest(req)
	if err != nil {
		return err
	}
	return s.SendEncoded(ctx, body)
}

// SendEncoded implements EncodedSender.
func (s *HTTPSender) SendEncoded(ctx context.Context, body []byte) error {
	_, static := s.opts.Credentials.(TokenFile)
	for attempt := 0; ; attempt++ {
		tok, err := s.opts.Credentials.Token(ctx)
		if err != nil {
			// A local fault or a failed authorize: retrying may help.
			return RetryableError{Err: fmt.Errorf("remote write credential: %w", err)}
		}
		err = s.post(ctx, body, tok)
		var he *HTTPError
		if !errors.As(err, &he) || he.Code != http.StatusUnauthorized || static {
			return err
		}
		if attempt == 0 && s.opts.Credentials.Rejected(tok) {
			continue // re-authorize once and retry this batch
		}
		// Rejected right after re-authorizing: keep the data queued.
		return RetryableError{Err: err}
	}
}

func (s *HTTPSender) post(ctx context.Context, body []byte, token string) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build write request: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	if s.opts.UserAgent != "" {
		req.Header.Set("User-Agent", s.opts.UserAgent)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return fmt.Errorf("remote write: %w", err)
		}
		return RetryableError{Err: fmt.Errorf("remote write: %w", err)}
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode/100 == 2 {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	herr := &HTTPError{Code: resp.StatusCode, Message: strings.TrimSpace(string(msg))}
	if resp.StatusCode/100 == 5 || resp.StatusCode == http.StatusTooManyRequests {
		return RetryableError{Err: herr, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	}
	return herr
}

// parseRetryAfter accepts delay-seconds or an HTTP date; 0 if absent or invalid.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// NewHTTPClient returns a client trusting the PEM CAs in caFile (system roots
// if empty). It fails if the file cannot be read or holds no certificate.
func NewHTTPClient(caFile string) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate found", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr}, nil
}
