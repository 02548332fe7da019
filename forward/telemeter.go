package forward

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
)

// Delivery protocols (--to-protocol).
const (
	// ProtocolAuto lets each /authorize answer decide: an answer with our
	// receiver's fields (tenant, expires_in_seconds), or no /authorize at
	// all, means remote-write; an answer with only telemeter-server's fields
	// (token, expiresInSeconds, labels) means the telemeter upload.
	ProtocolAuto = "auto"
	// ProtocolRemoteWrite is Prometheus remote-write to <to>/api/v1/write.
	ProtocolRemoteWrite = "remote-write"
	// ProtocolTelemeter is telemeter-client's protocol: /authorize, then
	// delimited MetricFamily protobufs in framed snappy to /upload.
	ProtocolTelemeter = "telemeter"
)

// TelemeterContentType is the body type of a telemeter upload: varint
// length-delimited io.prometheus.client.MetricFamily messages.
const TelemeterContentType = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"

// HeaderTimestamps: "source" on an upload asks our receiver to store the
// samples at their own timestamps, where it stores telemeter-client's at
// the time it receives them (as telemeter-server does). Ours are exact, and
// a backlog delivered after an outage must keep its times. A stock
// telemeter-server ignores the header.
// The receiver reads both from here: one definition of the protocol.
const (
	HeaderTimestamps = "X-Phonehome-Timestamps"
	TimestampsSource = "source"
)

// TelemeterAuthorizeURL is the authorize URL of the telemeter flow: toAuth
// (telemeter-client's --to-auth) if set, else <base>/authorize, with the
// query parameter id set to hashedID as telemeter-client sends it. An id
// already in toAuth is replaced: the raw cluster id never leaves the cluster.
func TelemeterAuthorizeURL(base *url.URL, toAuth, hashedID string) (string, error) {
	var u url.URL
	if toAuth != "" {
		p, err := url.Parse(toAuth)
		if err != nil {
			return "", err
		}
		u = *p
	} else {
		u = *base
		u.Path = strings.TrimSuffix(u.Path, "/") + "/authorize"
	}
	q := u.Query()
	q.Set("id", hashedID)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// grant is what a request needs from the Authorizer.
type grant struct {
	token     string
	labels    map[string]string // to set on every series (telemeter flow)
	telemeter bool              // the answer came from a stock telemeter-server
	direct    bool              // no /authorize: the fleet token is used as is
}

// grant returns a consistent token and its labels, exchanging if needed.
func (a *Authorizer) grant(ctx context.Context) (grant, error) {
	for range 3 { // a renewal may slip in between Token and the lookup
		tok, err := a.Token(ctx)
		if err != nil {
			return grant{}, err
		}
		a.mu.Lock()
		direct, c := a.direct, a.cur
		a.mu.Unlock()
		switch {
		case direct:
			return grant{token: tok, direct: true}, nil
		case c != nil && c.token == tok:
			return grant{token: tok, labels: c.labels, telemeter: c.telemeter}, nil
		}
	}
	return grant{}, fmt.Errorf("%w: credential changed while in use", ErrAuthorize)
}

// TelemeterSenderOptions tunes a TelemeterSender.
type TelemeterSenderOptions struct {
	UserAgent string
	// Timeout bounds one request (default 30s).
	Timeout    time.Duration
	Registerer prometheus.Registerer // nil: metrics are not registered
	// RateLimit is the server's upload window per cluster (default
	// DefaultTelemeterRateLimit, telemeter-server's --ratelimit; negative:
	// never wait). It is kept only once the server has refused an upload
	// for it (429 without Retry-After), so a receiver without that limit
	// is never waited for.
	RateLimit time.Duration
	// MaxAge drops older samples before the upload (default
	// DefaultTelemeterMaxAge, as telemeter-client: the age beyond which
	// telemeter-server refuses the whole upload, 400; negative: none).
	MaxAge time.Duration
}

// TelemeterSender delivers to a stock telemeter-server the way
// telemeter-client does: the Authorizer's /authorize exchange (re-done once
// when an upload gets 401), then POST of the batch as delimited
// MetricFamily messages, snappy framed, carrying every sample's original
// timestamp and the labels the authorize answer requires.
//
// Like telemeter-client, it leaves out what telemeter-server would refuse
// the whole upload for (dropRefused), and it keeps to the server's
// per-cluster upload rate limit once the server has shown it
// (uploadPacer), waiting before an upload rather than being refused.
//
// Errors follow the Sender contract: network errors, 5xx and 429 are
// RetryableErrors; other non-2xx are *HTTPError and the batch is dropped
// (telemeter-client treats only 200 as success; any 2xx is accepted here).
// Safe for concurrent use; the pacing assumes one upload at a time.
type TelemeterSender struct {
	url    string
	client *http.Client
	auth   *Authorizer
	opts   TelemeterSenderOptions
	pacer  *uploadPacer

	unsendable prometheus.Counter
}

// NewTelemeterSender returns a sender that uploads to uploadURL (e.g.
// <to>/upload) with credentials from auth.
func NewTelemeterSender(uploadURL string, client *http.Client, auth *Authorizer, opts TelemeterSenderOptions) *TelemeterSender {
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.RateLimit == 0 {
		opts.RateLimit = DefaultTelemeterRateLimit
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = DefaultTelemeterMaxAge
	}
	return &TelemeterSender{
		url: uploadURL, client: client, auth: auth, opts: opts,
		pacer: &uploadPacer{window: opts.RateLimit, now: time.Now},
		unsendable: promauto.With(opts.Registerer).NewCounter(prometheus.CounterOpts{
			Name: "phonehome_forward_telemeter_unsendable_samples_total",
			Help: "Samples a telemeter upload cannot carry (native histograms, series without a metric name) or telemeter-server refuses (names or label values over 255 bytes, samples older than the max age); they are skipped, as telemeter-client skips the latter.",
		}),
	}
}

// Send implements Sender.
func (s *TelemeterSender) Send(ctx context.Context, req *prompb.WriteRequest) error {
	for attempt := 0; ; attempt++ {
		g, err := s.auth.grant(ctx)
		if err != nil {
			// A failed authorize: keep the data queued.
			return RetryableError{Err: fmt.Errorf("telemeter upload credential: %w", err)}
		}
		families, skipped := TelemeterFamilies(req, g.labels)
		minTS := int64(math.MinInt64)
		if s.opts.MaxAge > 0 {
			minTS = time.Now().Add(-s.opts.MaxAge).UnixMilli()
		}
		families, refused := dropRefused(families, minTS)
		skipped += refused
		if attempt == 0 && skipped > 0 {
			s.unsendable.Add(float64(skipped))
		}
		if len(families) == 0 {
			return nil
		}
		body, err := EncodeTelemeter(families)
		if err != nil {
			return fmt.Errorf("encode telemeter upload: %w", err)
		}
		if err := s.pacer.wait(ctx); err != nil {
			return fmt.Errorf("telemeter upload: %w", err)
		}
		err = s.pacer.answered(s.post(ctx, body, g.token))
		var he *HTTPError
		if !errors.As(err, &he) || he.Code != http.StatusUnauthorized {
			return err
		}
		if attempt == 0 && s.auth.Rejected(g.token) {
			continue // re-authorize once, as telemeter-client does on its next request
		}
		return RetryableError{Err: err} // rejected right after re-authorizing: keep it queued
	}
}

// StoresAtArrival implements arrivalStamper: a stock telemeter-server
// stores every upload at the time it arrives (its OverwriteTimestamps);
// our receiver keeps the samples' own timestamps (HeaderTimestamps).
func (s *TelemeterSender) StoresAtArrival() bool { return s.auth.telemeterServer() }

// LearnServer implements arrivalStamper: before the first answer to
// /authorize it obtains a credential, as Send would (an error is left to
// Send, which keeps the batch queued), so that the server is known.
func (s *TelemeterSender) LearnServer(ctx context.Context) {
	if !s.auth.known() {
		_, _ = s.auth.Token(ctx)
	}
}

// WaitForWindow implements arrivalStamper: it learns the server; then,
// towards a stock telemeter-server, it waits, as Send would, until the
// server's upload window lets the next upload through, or ctx ends.
func (s *TelemeterSender) WaitForWindow(ctx context.Context) error {
	s.LearnServer(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !s.StoresAtArrival() {
		return nil
	}
	return s.pacer.wait(ctx)
}

func (s *TelemeterSender) post(ctx context.Context, body []byte, token string) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build upload request: %w", err)
	}
	req.Header.Set("Content-Type", TelemeterContentType)
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set(HeaderTimestamps, TimestampsSource)
	if s.opts.UserAgent != "" {
		req.Header.Set("User-Agent", s.opts.UserAgent)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return doError(ctx, "telemeter upload", err)
	}
	defer drainClose(resp)
	return responseError(resp)
}

// TelemeterFamilies converts a remote-write batch into metric families as
// telemeter-server expects them: one untyped family per metric name (sorted
// by name), one metric per sample with its original timestamp, metrics of a
// family in timestamp order (telemeter-server rejects a family out of
// order), labels sorted. labels are set on every metric, replacing a label
// of the same name. It returns the number of samples it cannot carry
// (native histograms, series without __name__).
func TelemeterFamilies(req *prompb.WriteRequest, labels map[string]string) ([]*dto.MetricFamily, int) {
	byName := map[string]*dto.MetricFamily{}
	skipped := 0
	for i := range req.Timeseries {
		ts := &req.Timeseries[i]
		skipped += len(ts.Histograms)
		name := ""
		pairs := make([]*dto.LabelPair, 0, len(ts.Labels)+len(labels))
		for _, l := range ts.Labels {
			switch _, replaced := labels[l.Name]; {
			case l.Name == model.MetricNameLabel:
				name = l.Value
			case !replaced:
				pairs = append(pairs, &dto.LabelPair{Name: new(l.Name), Value: new(l.Value)})
			}
		}
		if name == "" {
			skipped += len(ts.Samples)
			continue
		}
		if len(ts.Samples) == 0 {
			continue
		}
		for k, v := range labels {
			pairs = append(pairs, &dto.LabelPair{Name: new(k), Value: new(v)})
		}
		slices.SortFunc(pairs, func(a, b *dto.LabelPair) int { return cmp.Compare(a.GetName(), b.GetName()) })
		mf := byName[name]
		if mf == nil {
			mf = &dto.MetricFamily{Name: new(name), Type: dto.MetricType_UNTYPED.Enum()}
			byName[name] = mf
		}
		for _, smp := range ts.Samples {
			mf.Metric = append(mf.Metric, &dto.Metric{
				Label:       pairs,
				Untyped:     &dto.Untyped{Value: new(smp.Value)},
				TimestampMs: new(smp.Timestamp),
			})
		}
	}
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, mf := range byName {
		slices.SortStableFunc(mf.Metric, func(a, b *dto.Metric) int { return cmp.Compare(a.GetTimestampMs(), b.GetTimestampMs()) })
		out = append(out, mf)
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return out, skipped
}

// EncodeTelemeter writes families as a telemeter upload body: delimited
// MetricFamily messages in the snappy framed (stream) format.
func EncodeTelemeter(families []*dto.MetricFamily) ([]byte, error) {
	var buf bytes.Buffer
	sw := snappy.NewBufferedWriter(&buf)
	enc := expfmt.NewEncoder(sw, expfmt.NewFormat(expfmt.TypeProtoDelim))
	for _, mf := range families {
		if err := enc.Encode(mf); err != nil {
			return nil, err
		}
	}
	if err := sw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ProtocolSenderOptions configures a ProtocolSender.
type ProtocolSenderOptions struct {
	// Protocol is ProtocolAuto, ProtocolRemoteWrite or ProtocolTelemeter.
	Protocol string
	// Authorizer decides ProtocolAuto by its answers; nil means remote-write.
	Authorizer  *Authorizer
	RemoteWrite *HTTPSender           // required unless Protocol is ProtocolTelemeter
	Telemeter   *TelemeterSender      // required unless Protocol is ProtocolRemoteWrite (with an Authorizer)
	Logger      *slog.Logger          // nil: discard
	Registerer  prometheus.Registerer // nil: metrics are not registered
}

// ProtocolSender delivers each batch with remote-write or the telemeter
// upload, fixed or (ProtocolAuto) as the Authorizer's current answer says:
// only an answer from a stock telemeter-server selects the telemeter
// upload. It implements Sender and RecordSender. Safe for concurrent use.
type ProtocolSender struct {
	opts   ProtocolSenderOptions
	logger *slog.Logger
	inUse  *prometheus.GaugeVec

	mu   sync.Mutex
	last string
}

// NewProtocolSender returns a ProtocolSender.
func NewProtocolSender(opts ProtocolSenderOptions) *ProtocolSender {
	if opts.Protocol == "" {
		opts.Protocol = ProtocolAuto
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &ProtocolSender{opts: opts, logger: logger, inUse: promauto.With(opts.Registerer).NewGaugeVec(prometheus.GaugeOpts{
		Name: "phonehome_forward_delivery_protocol",
		Help: "1 for the delivery protocol in use (remote-write or telemeter), 0 for the other.",
	}, []string{"protocol"})}
	s.inUse.WithLabelValues(ProtocolRemoteWrite)
	s.inUse.WithLabelValues(ProtocolTelemeter)
	return s
}

// pick returns the protocol for the next batch, and whether it is
// remote-write only because auto found no /authorize (direct).
func (s *ProtocolSender) pick(ctx context.Context) (p string, direct bool, err error) {
	p = s.opts.Protocol
	if p == ProtocolAuto {
		p = ProtocolRemoteWrite
		if s.opts.Authorizer != nil {
			g, err := s.opts.Authorizer.grant(ctx)
			if err != nil {
				return "", false, RetryableError{Err: fmt.Errorf("choose delivery protocol: %w", err)}
			}
			direct = g.direct
			if g.telemeter && !g.direct {
				p = ProtocolTelemeter
			}
		}
	}
	s.mu.Lock()
	changed := s.last != p
	s.last = p
	s.mu.Unlock()
	if changed {
		s.inUse.WithLabelValues(p).Set(1)
		other := ProtocolTelemeter
		if p == ProtocolTelemeter {
			other = ProtocolRemoteWrite
		}
		s.inUse.WithLabelValues(other).Set(0)
		s.logger.Info("delivery protocol", "protocol", p, "configured", s.opts.Protocol)
	}
	return p, direct, nil
}

// noWriteEndpoint checks the answer to a remote-write that auto chose
// because /authorize answered 404 or 405. If the write endpoint is missing
// too (404, 405), the fleet endpoint is not our receiver: most likely a
// stock telemeter-server whose authorizer answered "not found" (it passes
// its authorizer's 404 on). The batch stays queued, and /authorize is asked
// again before the next attempt, instead of every batch being dropped.
func (s *ProtocolSender) noWriteEndpoint(direct bool, err error) error {
	var he *HTTPError
	if !direct || !errors.As(err, &he) || (he.Code != http.StatusNotFound && he.Code != http.StatusMethodNotAllowed) {
		return err
	}
	s.opts.Authorizer.reprobe()
	return RetryableError{Err: fmt.Errorf("no /authorize and no remote-write endpoint at the fleet endpoint, asking /authorize again: %w", err)}
}

// mayUpload reports whether batches may go with the telemeter upload
// (configured so, or auto).
func (s *ProtocolSender) mayUpload() bool {
	return s.opts.Protocol != ProtocolRemoteWrite && s.opts.Telemeter != nil
}

// StoresAtArrival implements arrivalStamper: true while batches go to a
// stock telemeter-server with the telemeter upload.
func (s *ProtocolSender) StoresAtArrival() bool {
	return s.mayUpload() && s.opts.Telemeter.StoresAtArrival()
}

// LearnServer implements arrivalStamper.
func (s *ProtocolSender) LearnServer(ctx context.Context) {
	if s.mayUpload() {
		s.opts.Telemeter.LearnServer(ctx)
	}
}

// WaitForWindow implements arrivalStamper.
func (s *ProtocolSender) WaitForWindow(ctx context.Context) error {
	if !s.mayUpload() {
		return nil
	}
	return s.opts.Telemeter.WaitForWindow(ctx)
}

// SendRecord implements RecordSender.
func (s *ProtocolSender) SendRecord(ctx context.Context, r Record) (Written, error) {
	p, direct, err := s.pick(ctx)
	if err != nil {
		return Written{}, err
	}
	if p == ProtocolRemoteWrite {
		w, err := s.opts.RemoteWrite.SendRecord(ctx, r)
		return w, s.noWriteEndpoint(direct, err)
	}
	req, err := r.toV1()
	if err != nil {
		return Written{}, err
	}
	return Written{}, s.opts.Telemeter.Send(ctx, req)
}

// Send implements Sender.
func (s *ProtocolSender) Send(ctx context.Context, req *prompb.WriteRequest) error {
	p, direct, err := s.pick(ctx)
	if err != nil {
		return err
	}
	if p == ProtocolRemoteWrite {
		return s.noWriteEndpoint(direct, s.opts.RemoteWrite.Send(ctx, req))
	}
	return s.opts.Telemeter.Send(ctx, req)
}
