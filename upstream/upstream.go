// Package upstream forwards the receiver's accepted writes (authenticated,
// limited, allowlisted) to an upstream remote-write endpoint such as Thanos
// Receive, Mimir, VictoriaMetrics or Prometheus, through a durable bounded
// queue with retry and backoff. Writer is a storage.Writer, so the receive
// handler is unaware of it.
package upstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/storage"
)

// ErrQueueFull is returned (wrapping storage.ErrNotReady, hence 503) by
// Write in forward_only mode while the queue cannot take the request.
var ErrQueueFull = fmt.Errorf("upstream queue full: %w", storage.ErrNotReady)

// Drop reasons of phonehome_upstream_dropped_samples_total.
const (
	reasonQueueFull = "queue_full" // also mode only: stored locally, not forwarded
	reasonHTTP4xx   = "http_4xx"   // the upstream refused the request
	reasonInvalid   = "invalid"    // an unreadable queue record
)

// Writer stores writes locally (mode also) and queues them for the upstream,
// or only queues them (mode forward_only).
//
// Write is safe for concurrent use and does not retain series. In
// forward_only mode a nil error means the request is fsynced in the queue,
// which survives restarts; a full queue refuses it with ErrQueueFull so the
// client retries later. In also mode the local write decides the result; a
// full queue drops the upstream copy and counts it. Run delivers the queue,
// oldest first, until its context ends; Close closes the queue after Run
// has returned.
type Writer struct {
	logger *slog.Logger
	local  storage.Writer // nil in forward_only mode
	q      *forward.Queue
	cfg    Config
	client *http.Client
	m      *metrics

	appendMtx sync.Mutex                     // makes "fits?" and Append one step
	appendQ   func(payloads ...[]byte) error // q.Append; tests fail its fsync
	sleep     func(ctx context.Context, d time.Duration) error
}

var _ storage.Writer = (*Writer)(nil)

// New opens the queue in queueDir. local is the receiver's storage; it is
// not used in forward_only mode. reg may be nil.
func New(logger *slog.Logger, reg prometheus.Registerer, local storage.Writer, queueDir string, cfg Config) (*Writer, error) {
	if cfg.Mode == ModeForwardOnly {
		local = nil
	} else if local == nil {
		return nil, errors.New("upstream mode also needs local storage")
	}
	q, err := forward.OpenQueue(queueDir, logger, nil, forward.QueueOptions{MaxBytes: int64(cfg.Queue.MaxBytes)})
	if err != nil {
		return nil, fmt.Errorf("open upstream queue: %w", err)
	}
	w := &Writer{
		logger: logger, local: local, q: q, cfg: cfg,
		client: &http.Client{Timeout: time.Duration(cfg.Timeout)},
		sleep:  forward.Sleep,
	}
	w.appendQ = q.Append
	w.m = newMetrics(reg, q)
	return w, nil
}

// Write implements storage.Writer.
func (w *Writer) Write(ctx context.Context, tenant string, series []prompb.TimeSeries) (storage.Stats, error) {
	var (
		stats    storage.Stats
		localErr error
	)
	if w.local != nil {
		stats, localErr = w.local.Write(ctx, tenant, series)
		var perr *storage.PartialError
		if localErr != nil && !errors.As(localErr, &perr) {
			return stats, localErr // nothing committed: the client retries, so don't forward
		}
	}
	rec, n, err := encodeRecord(tenant, series)
	if err != nil {
		return stats, errors.Join(localErr, err)
	}
	if err := w.enqueue(rec); err != nil {
		// Written but not fsynced (forward.PartialAppendError): it will be
		// delivered, unless the process dies first.
		var pe *forward.PartialAppendError
		queued := errors.As(err, &pe) && pe.Appended == 1
		if queued {
			w.m.queued.Add(float64(n.Samples + n.Histograms))
		}
		if w.local == nil {
			// Not durable, so not acknowledged: the client retries, and a
			// second copy upstream carries the same samples (a no-op there).
			w.m.refused.Inc()
			return storage.Stats{}, err
		}
		if queued {
			return stats, localErr
		}
		w.m.dropped.WithLabelValues(reasonQueueFull).Add(float64(n.Samples + n.Histograms))
		w.logger.Debug("upstream queue full, not forwarding", "err", err)
		return stats, localErr
	}
	w.m.queued.Add(float64(n.Samples + n.Histograms))
	if w.local == nil {
		return n, nil
	}
	return stats, localErr
}

func (w *Writer) enqueue(rec []byte) error {
	w.appendMtx.Lock()
	defer w.appendMtx.Unlock()
	// Never let the queue drop the oldest records to make room: what is
	// in it was acknowledged (forward_only) and must be delivered.
	if _, used := w.q.Len(); used+int64(len(rec))+64 > int64(w.cfg.Queue.MaxBytes) {
		return ErrQueueFull
	}
	return w.appendQ(rec)
}

// encodeRecord is | uvarint samples | uvarint len(tenant) | tenant | snappy(protobuf WriteRequest) |.
func encodeRecord(tenant string, series []prompb.TimeSeries) ([]byte, storage.Stats, error) {
	var st storage.Stats
	for _, s := range series {
		st.Samples += len(s.Samples)
		st.Histograms += len(s.Histograms)
		st.Exemplars += len(s.Exemplars)
	}
	raw, err := (&prompb.WriteRequest{Timeseries: series}).Marshal()
	if err != nil {
		return nil, st, fmt.Errorf("encode upstream request: %w", err)
	}
	rec := binary.AppendUvarint(nil, uint64(st.Samples+st.Histograms))
	rec = binary.AppendUvarint(rec, uint64(len(tenant)))
	rec = append(rec, tenant...)
	return append(rec, snappy.Encode(nil, raw)...), st, nil
}

func decodeRecord(rec []byte) (samples int, tenant string, body []byte, err error) {
	n, k := binary.Uvarint(rec)
	if k <= 0 {
		return 0, "", nil, errors.New("bad sample count")
	}
	rec = rec[k:]
	l, k := binary.Uvarint(rec)
	if k <= 0 || uint64(len(rec)-k) < l {
		return 0, "", nil, errors.New("bad tenant")
	}
	return int(n), string(rec[k : k+int(l)]), rec[k+int(l):], nil
}

// Run delivers queued requests oldest first until ctx ends. What is not
// delivered stays queued on disk for the next start.
func (w *Writer) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		p, pos, _, ok, err := w.q.Peek()
		if err != nil {
			return fmt.Errorf("read upstream queue: %w", err)
		}
		if !ok {
			select {
			case <-w.q.Notify():
			case <-ctx.Done():
			}
			continue
		}
		w.deliver(ctx, p, pos)
	}
	return nil
}

// deliver sends one record, retrying with capped exponential backoff (or
// the upstream's Retry-After) until it is accepted, refused with a 4xx
// (dropped and counted) or ctx ends (it stays queued).
func (w *Writer) deliver(ctx context.Context, rec []byte, pos forward.Position) {
	n, tenant, body, err := decodeRecord(rec)
	if err != nil {
		w.m.dropped.WithLabelValues(reasonInvalid).Inc()
		w.logger.Error("dropping undecodable upstream queue record", "err", err)
		w.ack(pos)
		return
	}
	for attempt := 0; ; attempt++ {
		start := time.Now()
		err := w.send(ctx, tenant, body)
		w.m.duration.Observe(time.Since(start).Seconds())
		w.m.requests.WithLabelValues(codeOf(err)).Inc()
		if err == nil {
			w.m.sent.Add(float64(n))
			w.ack(pos)
			if attempt > 0 {
				w.logger.Info("upstream write recovered", "attempts", attempt+1)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		var re forward.RetryableError
		if !errors.As(err, &re) && misconfigured(err) {
			// 401/403/404/405 say the upstream URL or credential is wrong, not
			// the data: keep it (these writes may already be acknowledged)
			// and retry until an operator fixes the configuration.
			if attempt == 0 {
				w.logger.Error("upstream refuses our credential or URL; keeping the data and retrying", "err", err)
			}
			re = forward.RetryableError{}
		} else if !errors.As(err, &re) {
			w.m.dropped.WithLabelValues(reasonHTTP4xx).Add(float64(n))
			w.logger.Warn("upstream refused write, dropping it", "samples", n, "err", err)
			w.ack(pos)
			return
		}
		w.m.retries.Inc()
		d := forward.Backoff(attempt, time.Duration(w.cfg.Queue.MinBackoff), time.Duration(w.cfg.Queue.MaxBackoff))
		if re.RetryAfter > 0 {
			d = min(re.RetryAfter, time.Duration(w.cfg.Queue.MaxBackoff))
		}
		if attempt == 0 {
			w.logger.Warn("upstream write failed, retrying", "err", err, "retry_in", d.String())
		}
		if w.sleep(ctx, d) != nil {
			return
		}
	}
}

func (w *Writer) ack(pos forward.Position) {
	if err := w.q.Ack(pos); err != nil {
		w.logger.Error("acknowledge upstream queue record", "err", err)
	}
}

// send posts one remote-write 1.0 request. Network errors, 5xx and 429 are
// retryable (forward.RetryableError); other statuses are *forward.HTTPError.
func (w *Writer) send(ctx context.Context, tenant string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build upstream request: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	req.Header.Set("User-Agent", "phonehome-receiver")
	if w.cfg.TenantHeader != "" {
		if w.cfg.Tenant != "" {
			tenant = w.cfg.Tenant
		}
		req.Header.Set(w.cfg.TenantHeader, tenant)
	}
	if f := w.cfg.BearerTokenFile; f != "" {
		tok, err := os.ReadFile(f)
		if err != nil { // a local fault: retrying helps once the file is back
			return forward.RetryableError{Err: fmt.Errorf("read upstream.bearer_token_file: %w", err)}
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return forward.RetryableError{Err: fmt.Errorf("upstream write: %w", err)}
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode/100 == 2 {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	herr := &forward.HTTPError{Code: resp.StatusCode, Message: strings.TrimSpace(string(msg))}
	if resp.StatusCode/100 == 5 || resp.StatusCode == http.StatusTooManyRequests {
		var after time.Duration
		if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s > 0 {
			after = time.Duration(s) * time.Second
		}
		return forward.RetryableError{Err: herr, RetryAfter: after}
	}
	return herr
}

// Close closes the queue. Call it after Run has returned.
func (w *Writer) Close() error { return w.q.Close() }

// misconfigured reports whether err is an upstream answer that blames the
// request's destination or credential rather than its content.
func misconfigured(err error) bool {
	var he *forward.HTTPError
	if !errors.As(err, &he) {
		return false
	}
	switch he.Code {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed:
		return true
	}
	return false
}

func codeOf(err error) string {
	if err == nil {
		return "2xx"
	}
	var he *forward.HTTPError
	if errors.As(err, &he) {
		return strconv.Itoa(he.Code/100) + "xx"
	}
	return "error"
}

type metrics struct {
	queued, sent, retries, refused prometheus.Counter
	dropped                        *prometheus.CounterVec
	requests                       *prometheus.CounterVec
	duration                       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, q *forward.Queue) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		queued: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_upstream_queued_samples_total", Help: "Samples put in the upstream queue.",
		}),
		sent: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_upstream_sent_samples_total", Help: "Samples the upstream accepted.",
		}),
		retries: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_upstream_retries_total", Help: "Upstream requests retried after a retryable failure.",
		}),
		refused: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_upstream_refused_requests_total", Help: "Writes refused because the upstream queue could not hold them durably (forward_only mode): full (503) or a disk error (500).",
		}),
		dropped: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_upstream_dropped_samples_total", Help: "Samples not forwarded, by reason.",
		}, []string{"reason"}),
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_upstream_requests_total", Help: "Upstream remote-write requests by result.",
		}, []string{"code"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "phonehome_upstream_request_duration_seconds", Help: "Duration of upstream remote-write requests.",
			Buckets: prometheus.DefBuckets,
		}),
	}
	for _, r := range []string{reasonQueueFull, reasonHTTP4xx, reasonInvalid} {
		m.dropped.WithLabelValues(r)
	}
	for _, c := range []string{"2xx", "4xx", "5xx", "error"} {
		m.requests.WithLabelValues(c)
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "phonehome_upstream_queue_bytes", Help: "Bytes of the upstream queue on disk.",
	}, func() float64 { _, b := q.Len(); return float64(b) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "phonehome_upstream_queue_requests", Help: "Requests waiting in the upstream queue.",
	}, func() float64 { n, _ := q.Len(); return float64(n) })
	return m
}
