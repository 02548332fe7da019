package forward

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/atomicfile"
	"github.com/phonehome/phonehome/webtls"
)

// Sender delivers one remote-write request.
//
// Send is safe for concurrent use and does not retain req. An error is
// retryable if errors.As(err, &RetryableError{}) holds; any other error means
// the request was rejected and must not be sent again.
type Sender interface {
	Send(ctx context.Context, req *prompb.WriteRequest) error
}

// RecordSender is implemented by senders that deliver queued records
// themselves, choosing the protocol version (and re-encoding the record when
// it is stored in the other one). Same error contract as Sender. On success
// the returned Written holds the counts the receiver reported, if any.
type RecordSender interface {
	SendRecord(ctx context.Context, r Record) (Written, error)
}

// Written is what a receiver reported in the
// X-Prometheus-Remote-Write-{Samples,Histograms,Exemplars}-Written headers.
type Written struct {
	Samples, Histograms, Exemplars int
	// Known is false if the response carried none of the headers.
	Known bool
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

// Remote-write versions to send (HTTPSenderOptions.Version, --remote-write.version).
const (
	VersionAuto = "auto" // 2.0, falling back to 1.0 (remembered) when the endpoint needs it
	VersionV1   = "1"
	VersionV2   = "2" // 2.0 only: a 415 is a rejection like any 4xx
)

// Reasons for a fallback from 2.0 to 1.0 (the reason label of
// phonehome_forward_remote_write_fallbacks_total).
const (
	FallbackUnsupported    = "unsupported_media_type"  // 415 to a 2.0 request
	FallbackMissingHeaders = "missing_written_headers" // 2xx without written counts: a 1.0 receiver
	FallbackBadRequest     = "bad_request"             // 400 to 2.0 but 2xx to 1.0, before 2.0 was ever confirmed
)

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

	// Version is VersionAuto (default), VersionV1 or VersionV2.
	Version string
	// StateFile, if set, persists an auto fallback to 1.0 for this endpoint
	// across restarts (JSON, replaced atomically).
	StateFile string
	// ReprobeAfter is how long a fallback to 1.0 lasts before 2.0 is tried
	// again (default 24h).
	ReprobeAfter time.Duration
	Logger       *slog.Logger          // nil: discard
	Registerer   prometheus.Registerer // nil: metrics are not registered

	now func() time.Time // tests
}

// HTTPSender is a Prometheus remote-write client speaking 2.0 and 1.0.
//
// With VersionAuto it sends 2.0 until the endpoint shows it does not speak
// it: a 415, a 2xx without the written-count headers (a 1.0 receiver that
// misread the body), or a 400 to 2.0 followed by a 2xx to the same data in
// 1.0 while the endpoint never proved it speaks 2.0 (Prometheus 2.42 answers
// 2.0 with 400). The request is then re-sent in 1.0 at once, so no data is
// lost, and 1.0 is used for ReprobeAfter (persisted in StateFile).
//
// Safe for concurrent use.
type HTTPSender struct {
	url    string
	client *http.Client
	opts   HTTPSenderOptions
	logger *slog.Logger
	m      senderMetrics

	mu        sync.Mutex
	fallback  *protoState // non-nil: auto mode speaks 1.0 until fallback.Since+ReprobeAfter
	confirmed bool        // a 2.0 response carried written counts
}

// protoState is the persisted fallback of one endpoint.
type protoState struct {
	Endpoint string    `json:"endpoint"`
	Protocol string    `json:"protocol"`
	Reason   string    `json:"reason"`
	Since    time.Time `json:"since"`
}

type senderMetrics struct {
	fallbacks *prometheus.CounterVec
	version   prometheus.Gauge
}

// NewHTTPSender returns a sender that POSTs to <base>/api/v1/write.
func NewHTTPSender(base *url.URL, client *http.Client, opts HTTPSenderOptions) *HTTPSender {
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.Credentials == nil {
		opts.Credentials = TokenFile(opts.TokenFile)
	}
	if opts.Version == "" {
		opts.Version = VersionAuto
	}
	if opts.ReprobeAfter <= 0 {
		opts.ReprobeAfter = 24 * time.Hour
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	u := *base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/write"
	f := promauto.With(opts.Registerer)
	s := &HTTPSender{url: u.String(), client: client, opts: opts, logger: logger, m: senderMetrics{
		fallbacks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_remote_write_fallbacks_total",
			Help: "Fallbacks from remote-write 2.0 to 1.0, by reason.",
		}, []string{"reason"}),
		version: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_remote_write_version",
			Help: "Remote-write major version in use (1 or 2).",
		}),
	}}
	for _, r := range []string{FallbackUnsupported, FallbackMissingHeaders, FallbackBadRequest} {
		s.m.fallbacks.WithLabelValues(r)
	}
	if opts.Version == VersionAuto && opts.StateFile != "" {
		s.loadState()
	}
	s.m.version.Set(majorOf(s.current()))
	return s
}

func majorOf(proto string) float64 {
	if proto == ProtoV2 {
		return 2
	}
	return 1
}

func (s *HTTPSender) loadState() {
	if err := atomicfile.RemoveStale(s.logger, s.opts.StateFile); err != nil {
		s.logger.Warn("remove temporary remote-write state files", "err", err)
	}
	b, err := os.ReadFile(s.opts.StateFile)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.logger.Warn("read remote-write state, probing 2.0", "file", s.opts.StateFile, "err", err)
		}
		return
	}
	var st protoState
	if err := json.Unmarshal(b, &st); err != nil {
		s.logger.Warn("invalid remote-write state, probing 2.0", "file", s.opts.StateFile, "err", err)
		return
	}
	if st.Endpoint != s.url || st.Protocol != ProtoV1 {
		return // another endpoint: probe this one
	}
	s.fallback = &st
	s.logger.Info("remote-write 1.0 remembered for this endpoint", "reason", st.Reason, "since", st.Since, "reprobe_after", s.opts.ReprobeAfter.String())
}

// saveState persists (st != nil) or removes the fallback; failures only cost
// a re-probe after restart, so they are logged.
func (s *HTTPSender) saveState(st *protoState) {
	if s.opts.StateFile == "" {
		return
	}
	if st == nil {
		if err := os.Remove(s.opts.StateFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.logger.Warn("remove remote-write state", "file", s.opts.StateFile, "err", err)
		}
		return
	}
	b, _ := json.Marshal(st)
	if err := atomicfile.Write(s.opts.StateFile, b, 0o600); err != nil {
		s.logger.Warn("persist remote-write state", "file", s.opts.StateFile, "err", err)
	}
}

// current is the protocol to use for the next request.
func (s *HTTPSender) current() string {
	switch s.opts.Version {
	case VersionV1:
		return ProtoV1
	case VersionV2:
		return ProtoV2
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fallback != nil && s.opts.now().Sub(s.fallback.Since) < s.opts.ReprobeAfter {
		return ProtoV1
	}
	return ProtoV2
}

// fallBack switches an auto sender to 1.0 for ReprobeAfter.
func (s *HTTPSender) fallBack(reason string, cause error) {
	st := &protoState{Endpoint: s.url, Protocol: ProtoV1, Reason: reason, Since: s.opts.now().UTC()}
	s.mu.Lock()
	s.fallback, s.confirmed = st, false
	s.mu.Unlock()
	s.m.fallbacks.WithLabelValues(reason).Inc()
	s.m.version.Set(1)
	s.saveState(st)
	args := []any{"reason", reason, "reprobe_after", s.opts.ReprobeAfter.String()}
	if cause != nil {
		args = append(args, "err", cause)
	}
	s.logger.Warn("receiver does not speak remote-write 2.0, falling back to 1.0", args...)
}

// confirm records that the endpoint speaks 2.0.
func (s *HTTPSender) confirm() {
	s.mu.Lock()
	was := s.fallback
	s.fallback, s.confirmed = nil, true
	s.mu.Unlock()
	s.m.version.Set(2)
	if was != nil {
		s.saveState(nil)
		s.logger.Info("receiver speaks remote-write 2.0 again")
	}
}

func (s *HTTPSender) isConfirmed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.confirmed
}

// Send implements Sender.
func (s *HTTPSender) Send(ctx context.Context, req *prompb.WriteRequest) error {
	body, err := EncodeWriteRequest(req)
	if err != nil {
		return err
	}
	_, err = s.SendRecord(ctx, Record{Proto: ProtoV1, Body: body, Samples: countSamples(req)})
	return err
}

// SendEncoded sends a snappy-compressed 1.0 request (in 2.0 if that is in force).
func (s *HTTPSender) SendEncoded(ctx context.Context, body []byte) error {
	r := Record{Proto: ProtoV1, Body: body}
	if req, err := r.toV1(); err == nil {
		r.Samples = countSamples(req)
	}
	_, err := s.SendRecord(ctx, r)
	return err
}

func countSamples(req *prompb.WriteRequest) int {
	n := 0
	for i := range req.Timeseries {
		n += len(req.Timeseries[i].Samples) + len(req.Timeseries[i].Histograms)
	}
	return n
}

// SendRecord implements RecordSender.
func (s *HTTPSender) SendRecord(ctx context.Context, r Record) (Written, error) {
	proto := s.current()
	w, err := s.sendAs(ctx, r, proto)
	if proto != ProtoV2 || s.opts.Version != VersionAuto {
		return w, err
	}
	var he *HTTPError
	switch {
	case errors.As(err, &he) && he.Code == http.StatusUnsupportedMediaType:
		s.fallBack(FallbackUnsupported, err)
		return s.sendAs(ctx, r, ProtoV1)
	case err == nil && w.Known, w.Known && errors.As(err, &he):
		s.confirm()
	case errors.As(err, &he) && he.Code == http.StatusBadRequest && !s.isConfirmed():
		w1, err1 := s.sendAs(ctx, r, ProtoV1)
		if err1 != nil {
			return w1, err1
		}
		s.fallBack(FallbackBadRequest, err)
		return w1, nil
	case err == nil && r.Samples != 0:
		// A 2xx without written counts: per the 2.0 spec a 1.0 receiver,
		// which may have stored nothing of the 2.0 body. Re-send in 1.0
		// (re-writing identical samples is harmless).
		s.fallBack(FallbackMissingHeaders, nil)
		return s.sendAs(ctx, r, ProtoV1)
	}
	return w, err
}

// sendAs posts r in proto, re-authorizing once on a 401.
func (s *HTTPSender) sendAs(ctx context.Context, r Record, proto string) (Written, error) {
	body, err := r.as(proto)
	if err != nil {
		return Written{}, err
	}
	var static bool // a 401/403 is a rejection: asking again yields the same token
	switch s.opts.Credentials.(type) {
	case TokenFile, StaticToken:
		static = true
	}
	for attempt := 0; ; attempt++ {
		tok, err := s.opts.Credentials.Token(ctx)
		if err != nil {
			// A local fault or a failed authorize: retrying may help, after
			// the receiver's Retry-After on /authorize if it gave one.
			var re RetryableError
			errors.As(err, &re)
			return Written{}, RetryableError{Err: fmt.Errorf("remote write credential: %w", err), RetryAfter: re.RetryAfter}
		}
		w, err := s.post(ctx, body, proto, tok)
		var he *HTTPError
		if !errors.As(err, &he) || static {
			return w, err
		}
		if he.Code == http.StatusForbidden {
			// With an exchanged credential, 403 means the credential in use is
			// the wrong kind (e.g. the fleet token used directly after a
			// transient 404 at /authorize): probe /authorize again and keep
			// the data queued rather than drop it.
			s.opts.Credentials.Rejected(tok)
			return w, RetryableError{Err: err}
		}
		if he.Code != http.StatusUnauthorized {
			return w, err
		}
		if attempt == 0 && s.opts.Credentials.Rejected(tok) {
			continue // re-authorize once and retry this batch
		}
		// Rejected right after re-authorizing: keep the data queued.
		return w, RetryableError{Err: err}
	}
}

func (s *HTTPSender) post(ctx context.Context, body []byte, proto, token string) (Written, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return Written{}, fmt.Errorf("build write request: %w", err)
	}
	if proto == ProtoV2 {
		req.Header.Set("Content-Type", contentTypeV2)
	} else {
		req.Header.Set("Content-Type", contentTypeV1)
	}
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("X-Prometheus-Remote-Write-Version", proto)
	if s.opts.UserAgent != "" {
		req.Header.Set("User-Agent", s.opts.UserAgent)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Written{}, doError(ctx, "remote write", err)
	}
	defer drainClose(resp)
	return parseWritten(resp.Header), responseError(resp)
}

// doError classifies a failed client.Do: the caller's own cancellation is
// final, anything else (the network) is retryable.
func doError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return RetryableError{Err: fmt.Errorf("%s: %w", what, err)}
}

// responseError is nil for a 2xx. 5xx and 429 are retryable, with the
// server's Retry-After; any other status is an *HTTPError (the batch is
// dropped). It reads at most 512 bytes of the body for the message.
func responseError(resp *http.Response) error {
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

// drainClose reads a little of what is left of the body, so the connection
// can be reused, and closes it.
func drainClose(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// parseWritten reads the written-count headers; an absent or invalid one counts 0.
func parseWritten(h http.Header) Written {
	var w Written
	for _, f := range []struct {
		name string
		n    *int
	}{
		{"X-Prometheus-Remote-Write-Samples-Written", &w.Samples},
		{"X-Prometheus-Remote-Write-Histograms-Written", &w.Histograms},
		{"X-Prometheus-Remote-Write-Exemplars-Written", &w.Exemplars},
	} {
		v := h.Get(f.name)
		if v == "" {
			continue
		}
		w.Known = true
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
			*f.n = n
		}
	}
	return w
}

// parseRetryAfter accepts delay-seconds or an HTTP date; 0 if absent or invalid.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	// Out of range is still a number: a huge wait saturates (and is capped
	// by the caller) rather than wrapping around to a short one.
	if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		switch {
		case s < 0:
			return 0
		case s > int64(math.MaxInt64/time.Second):
			return math.MaxInt64
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

// NewHTTPClient returns a client that trusts the PEM CAs in caFile (the
// system roots when empty), re-read when the file changes on disk
// (webtls.CAFileTransport: a rotated service CA needs no restart), and
// presents the client certificate that cert returns (nil: none; see
// webtls.ClientCertificate). It fails if caFile cannot be read or holds no
// certificate. logger (nil: none) hears of a changed bundle.
func NewHTTPClient(caFile string, cert func(*tls.CertificateRequestInfo) (*tls.Certificate, error), logger *slog.Logger) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetClientCertificate: cert}
	rt, err := webtls.CAFileTransport(tr, caFile, logger)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: rt}, nil
}
