// Package receive is the remote-write HTTP ingest: it decodes snappy+protobuf
// requests within size limits, validates every series, binds them to the
// authenticated identity, writes them through storage.Writer, and maps every
// outcome to the status code the remote-write spec asks for.
package receive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
)

// Response headers of the remote-write 2.0 spec, sent on every response.
const (
	headerSamplesWritten    = "X-Prometheus-Remote-Write-Samples-Written"
	headerHistogramsWritten = "X-Prometheus-Remote-Write-Histograms-Written"
	headerExemplarsWritten  = "X-Prometheus-Remote-Write-Exemplars-Written"
)

// maxErrorsInBody bounds how many per-series problems a response lists.
const maxErrorsInBody = 5

// Options configures a Handler.
type Options struct {
	// Policy is the initial server-side allowlist and label elision; nil
	// keeps everything. SetPolicy replaces it.
	Policy *Policy
	// Ready reports whether writes may be accepted; nil means always.
	Ready func() bool
	// OverwriteClusterID replaces a series' foreign _id with the
	// credential's instead of rejecting the series.
	OverwriteClusterID bool
	// AcceptedMessages are the remote-write protobuf messages accepted
	// (prometheus.WriteRequest, io.prometheus.write.v2.Request); nil means
	// both. Another one is answered 415.
	AcceptedMessages []string
	// Telemeter configures Telemeter's paths (telemeter.go).
	Telemeter TelemeterOptions
	// Denied reports whether a cluster was erased and is refused until
	// re-admitted (storage.DB.Denied). Its series are refused before the
	// limiter sees them, so an erased cluster neither takes series budget
	// nor shows on the status page. Nil denies nothing (storage still
	// refuses such series, later).
	Denied func(tenant, cluster string) bool
	// MaxInflight bounds the write requests read, decoded and written at
	// once across every tenant and cluster (limits.max_inflight_requests_per_cluster
	// bounds one cluster's); more are answered 503 with Retry-After before
	// their body is read. 0 = unlimited.
	MaxInflight int
	// MaxInflightBytes bounds the memory the write requests in flight hold
	// at once (bodies, decoded bytes and structures, as they are read and
	// decoded); a request that would pass it while others hold memory waits
	// its turn (first come, first served, inflightBytes), and is answered
	// 503 with Retry-After if its wait runs out. 0 = unlimited.
	MaxInflightBytes int64
}

// errOverloaded refuses a write while Options.MaxInflight are served.
var errOverloaded = fmt.Errorf("%w: too many write requests in flight, retry later", storage.ErrNotReady)

// hintedWriter is implemented by a storage.Writer that takes a hint per
// series (*storage.DB: the series' head reference) from the caller, and
// updates it, so that the caller can keep it with its own per-series state:
// the limiter's entry of the series, found by the same lookup that admits
// it. One map lookup per sample instead of two, and one entry per series
// instead of two (bench/results/README.md, issue 19).
type hintedWriter interface {
	WriteHinted(ctx context.Context, tenant string, series []prompb.TimeSeries, meta []metadata.Metadata, hints []uint64) (storage.Stats, error)
}

// hintScratch holds a request's series keys and hints, parallel to the
// valid series (pooled: a request makes no garbage).
type hintScratch struct {
	keys  []limits.Key
	hints []uint64
	prev  []uint64
}

var hintScratchPool = sync.Pool{New: func() any { return new(hintScratch) }}

// metadataWriter is implemented by a storage.Writer that keeps metric
// metadata (*storage.DB). meta has one entry per series.
type metadataWriter interface {
	WriteWithMetadata(ctx context.Context, tenant string, series []prompb.TimeSeries, meta []metadata.Metadata) (storage.Stats, error)
}

// Handler serves POST /api/v1/write. It expects auth.Middleware in front of
// it: the tenant and bound cluster id come only from the request context.
type Handler struct {
	logger   *slog.Logger
	writer   storage.Writer
	metaW    metadataWriter       // nil: metadata is dropped
	hintW    hintedWriter         // nil: the writer keeps its own series cache
	famW     familyMetadataWriter // nil: 1.0 metadata is dropped
	limiter  *limits.Limiter
	policy   atomic.Pointer[Policy]
	opts     Options
	metrics  *metrics
	inflight atomic.Int64   // write requests being served (Options.MaxInflight, the inflight gauge)
	bytes    *inflightBytes // nil: Options.MaxInflightBytes is 0
	// replicas elects one Prometheus replica per cluster on Telemeter's
	// remote-write path; nil without a replica label.
	replicas *replicaTracker
	// release returns a request's buffers once it is answered; tests
	// replace it to prove nothing kept a string aliasing them.
	release func(*bytesBuffer)
}

// NewHandler returns a remote-write handler that admits writes through lim
// and stores them in w. reg may be nil.
func NewHandler(logger *slog.Logger, reg prometheus.Registerer, w storage.Writer, lim *limits.Limiter, opts Options) *Handler {
	h := &Handler{logger: logger, writer: w, limiter: lim, opts: opts, metrics: newMetrics(reg), release: putBuffer}
	h.metrics.inflight = promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Name: "phonehome_receive_inflight_requests",
		Help: "Write requests being read, decoded and written now, all tenants and clusters.",
	}, func() float64 { return float64(h.inflight.Load()) })
	for _, l := range []string{limitRequests, limitBytes} {
		h.metrics.overloaded.WithLabelValues(l) // exported at 0
	}
	if opts.MaxInflightBytes > 0 {
		h.bytes = &inflightBytes{max: opts.MaxInflightBytes, wait: inflightBytesWait}
		promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
			Name: "phonehome_receive_inflight_bytes",
			Help: "Memory reserved by the write requests in flight (bodies, decoded bytes and structures), of --receive.max-inflight-bytes.",
		}, func() float64 { return float64(h.bytes.used.Load()) })
		promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
			Name: "phonehome_receive_inflight_bytes_waiting_requests",
			Help: fmt.Sprintf("Write requests waiting for --receive.max-inflight-bytes to admit them (or to let them grow), up to %s each.", inflightBytesWait),
		}, func() float64 { return float64(h.bytes.waiting()) })
	}
	h.metaW, _ = w.(metadataWriter)
	h.famW, _ = w.(familyMetadataWriter)
	h.hintW, _ = w.(hintedWriter)
	if opts.Telemeter.ReplicaLabel != "" {
		h.replicas = newReplicaTracker(opts.Telemeter.ReplicaFailover)
	}
	if opts.Policy == nil {
		opts.Policy = &Policy{}
	}
	h.policy.Store(opts.Policy)
	return h
}

// SetPolicy atomically replaces the server-side policy (config reload).
func (h *Handler) SetPolicy(p *Policy) { h.policy.Store(p) }

// CountUnauthenticated records a request refused by auth.Middleware, under
// the status it was answered with (401, 403, or 503 when the authorizer
// could not answer).
func (h *Handler) CountUnauthenticated(r *http.Request, err error) {
	h.metrics.unauthenticated.Inc()
	h.metrics.requests.WithLabelValues(routeOf(r.URL.Path).path(), strconv.Itoa(auth.RejectStatus(err))).Inc()
}

// ServeHTTP implements http.Handler: remote-write 1.0 and 2.0.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, routeRemoteWrite)
}

// ServeTelemeterWrite serves Prometheus' telemetry remote-write on
// Telemeter's POST /metrics/v1/receive: remote-write, as Telemeter treats it
// (telemeter.go).
func (h *Handler) ServeTelemeterWrite(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, routeTelemeterWrite)
}

// serve handles a remote-write request, or a telemeter-client upload.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, rt route) {
	start := time.Now()
	written, proto, err := h.handle(r, rt)
	code := statusFor(err)
	if err == nil && rt == routeUpload {
		code = http.StatusOK // telemeter-client takes nothing else for success
	}
	if rt == routeTelemeterWrite && code == http.StatusTooManyRequests {
		code = telemeterRetryable
	}

	hdr := w.Header()
	if proto != protoV1 { // 1.0 responses carry no counts, as Prometheus' (the compliance suite checks it)
		hdr.Set(headerSamplesWritten, strconv.Itoa(written.Samples))
		hdr.Set(headerHistogramsWritten, strconv.Itoa(written.Histograms))
		hdr.Set(headerExemplarsWritten, strconv.Itoa(written.Exemplars))
	}
	h.metrics.requests.WithLabelValues(rt.path(), strconv.Itoa(code)).Inc()
	h.metrics.duration.Observe(time.Since(start).Seconds())
	if err == nil {
		w.WriteHeader(code)
		return
	}
	var rl *rateLimitedError
	switch {
	case code >= 500 && !errors.As(err, &rl) && !errors.Is(err, storage.ErrNotReady):
		// A limit answered 503 (telemeterRetryable), a start or stop, and
		// an overload (counted in overloaded_requests) are no fault: one
		// error line per refused write would flood the log under load.
		h.logger.Error("write failed", "code", code, "err", err)
	default:
		h.logger.Debug("write rejected", "code", code, "err", err)
	}
	switch {
	case errors.As(err, &rl) && code != http.StatusRequestEntityTooLarge:
		hdr.Set("Retry-After", strconv.Itoa(int(math.Ceil(rl.retryAfter.Seconds()))))
	case code == http.StatusServiceUnavailable:
		hdr.Set("Retry-After", "5")
	}
	http.Error(w, err.Error(), code)
}

// handle serves one request and also returns the protobuf message it
// carried ("" when it was refused before its headers were read).
func (h *Handler) handle(r *http.Request, rt route) (written storage.Stats, proto string, err error) {
	if h.opts.Ready != nil && !h.opts.Ready() {
		return storage.Stats{}, proto, storage.ErrNotReady
	}
	id, ok := auth.FromContext(r.Context())
	if !ok {
		return storage.Stats{}, proto, errors.New("request reached the write handler without an identity")
	}
	if rt == routeUpload {
		proto, err = protoFamilies, negotiateUpload(r.Header)
	} else {
		proto, err = negotiate(r.Header, h.opts.AcceptedMessages)
	}
	if err != nil {
		return storage.Stats{}, proto, err
	}

	if h.opts.Denied != nil && id.ClusterID != "" && h.opts.Denied(id.Tenant, id.ClusterID) {
		// A credential of an erased cluster: refused whole before its body
		// is read and before the limiter's rate bucket, in-flight count or
		// status page hold the cluster's id again (docs/lifecycle.md).
		return storage.Stats{}, proto, errErasedCredential
	}
	if retry, err := h.limiter.CheckExhausted(id.Tenant, id.ClusterID); err != nil {
		return storage.Stats{}, proto, &rateLimitedError{retryAfter: retry, err: err} // before reading the body: cheap
	}
	serving := h.inflight.Add(1)
	defer h.inflight.Add(-1)
	if limit := int64(h.opts.MaxInflight); limit > 0 && serving > limit {
		h.metrics.overloaded.WithLabelValues(limitRequests).Inc()
		return storage.Stats{}, proto, errOverloaded
	}
	inflight, err := h.limiter.StartRequest(id.Tenant, id.ClusterID) // also before the body: one cluster cannot hold every handler
	if err != nil {
		return storage.Stats{}, proto, &rateLimitedError{retryAfter: limits.InFlightRetryAfter, err: err}
	}
	defer inflight.Done()
	buf := bufPool.Get().(*bytesBuffer)
	defer h.release(buf)
	buf.res = reservation{pool: h.bytes, ctx: r.Context()}
	defer buf.res.release() // before the buffer is released: runs first
	lim := h.limiter.For(id.Tenant)
	maxSamples := lim.MaxSamplesPerRequest(id.ClusterID != "")
	b, err := h.decode(r, proto, buf, &lim, maxSamples)
	if errors.Is(err, errOverloadedBytes) {
		h.metrics.overloaded.WithLabelValues(limitBytes).Inc()
	}
	if errors.Is(err, errOverBurst) {
		// Decoding stopped at the first sample past the burst: refused as
		// AllowSamples refuses it (413, the limit named, counted, on the
		// status page).
		err = h.allowSamples(id, maxSamples+1)
	}
	if err != nil {
		return storage.Stats{}, proto, err
	}
	h.metrics.requestsByProto.WithLabelValues(proto).Inc()
	if b.invalidMeta > 0 {
		h.metrics.rejected.WithLabelValues(reasonInvalidMetadata).Add(float64(b.invalidMeta))
	}
	if rt.telemeter() && h.replicas != nil {
		label := h.opts.Telemeter.ReplicaLabel
		if rt == routeTelemeterWrite && !h.electedReplica(id, replicaOf(b.series, label), b.samples()) {
			// The other replica's copy: answered as written, counts included
			// (Prometheus takes a 2.0 answer that wrote less than it sent
			// for a failure).
			return b.stats(), proto, nil
		}
		dropLabel(b.series, label)
	}
	n := b.samples()
	if len(b.familyMeta) > 0 {
		n++ // a metadata-only request is not free either
	}
	if err := h.allowSamples(id, n); err != nil {
		return storage.Stats{}, proto, err
	}
	if err := h.writeFamilyMetadata(id.Tenant, b.familyMeta); err != nil {
		return storage.Stats{}, proto, err
	}
	written, err = h.write(r, id, &lim, b, proto, rt)
	return written, proto, err
}

// allowSamples takes n samples from the cluster's and tenant's rate limits,
// or counts the refusal (metrics, status page) and returns it.
func (h *Handler) allowSamples(id auth.Identity, n int) error {
	retry, err := h.limiter.AllowSamples(id.Tenant, id.ClusterID, n)
	if err == nil {
		return nil
	}
	h.metrics.rejected.WithLabelValues(reasonRateLimit).Add(float64(n))
	h.limiter.Refused(id.Tenant, id.ClusterID, reasonRateLimit, n) // status page
	return &rateLimitedError{retryAfter: retry, err: err}
}

// electedReplica reports whether the cluster's writes from replica are
// written, and counts what it drops.
func (h *Handler) electedReplica(id auth.Identity, replica string, samples int) bool {
	if replica == "" || id.ClusterID == "" { // no cluster to elect for (--insecure.no-auth)
		return true
	}
	ok, failedOver := h.replicas.accept(id.Tenant, id.ClusterID, replica, time.Now())
	if failedOver {
		h.metrics.replicaFailovers.Inc()
	}
	if !ok {
		h.metrics.replicaDropped.Add(float64(samples))
	}
	return ok
}

// decode reads r's body into buf and decodes it as proto, within lim's sizes.
// Decoding stops past maxSamples (0: none), more than the limits admit.
func (h *Handler) decode(r *http.Request, proto string, buf *bytesBuffer, lim *limits.TenantLimits, maxSamples int) (*batch, error) {
	var (
		raw  []byte
		sent int64
		err  error
	)
	if r.ContentLength > 0 && r.ContentLength <= lim.MaxBodyBytes {
		if err := buf.res.cover(r.ContentLength); err != nil { // declared: reserved before it is read
			return nil, err
		}
	}
	if buf.res.limited() {
		r.Body = reservingBody(r.Body, &buf.res)
	}
	if proto == protoFamilies {
		raw, sent, err = readUpload(r, lim.MaxBodyBytes, lim.MaxDecodedBytes, buf, buf.decoded)
	} else {
		raw, err = readBody(r, lim.MaxBodyBytes, lim.MaxDecodedBytes, &buf.body, buf.decoded, &buf.res)
		sent = int64(buf.body.Len())
	}
	if raw != nil {
		buf.decoded = raw[:0]
	}
	if errors.Is(err, errOverloadedBytes) {
		return nil, errOverloadedBytes // refused while the body was read, not the body's fault
	}
	if err != nil {
		return nil, err
	}
	h.metrics.bytes.WithLabelValues("snappy").Add(float64(sent))
	h.metrics.bytes.WithLabelValues("decoded").Add(float64(len(raw)))

	switch proto {
	case protoFamilies:
		now := time.Now().UnixMilli()
		buf.fam.maxSamples = maxSamples
		buf.fam.res = &buf.res
		if err := decodeFamilies(raw, &buf.fam, now, !keepUploadTimestamps(r)); err != nil {
			return nil, err
		}
		h.countRestamped(&buf.fam)
		return &batch{series: buf.fam.series, familyMeta: buf.fam.meta}, nil
	case protoV2:
		buf.v2.maxSamples = maxSamples
		buf.v2.res = &buf.res
		if err := decodeV2(raw, &buf.v2); err != nil {
			return nil, err
		}
		return convertV2(&buf.v2, lim)
	default:
		buf.v1.maxSamples = maxSamples
		buf.v1.res = &buf.res
		if err := decodeV1(raw, &buf.v1); err != nil {
			return nil, err
		}
		return &batch{series: buf.v1.req.Timeseries, familyMeta: buf.v1.req.Metadata}, nil
	}
}

// Bounds of one 1.0 metadata entry; longer ones are dropped and counted.
const (
	maxHelpBytes = 1024
	maxUnitBytes = 64
)

// familyMetadataWriter keeps remote-write 1.0 metadata (per metric family).
type familyMetadataWriter interface {
	WriteFamilyMetadata(tenant string, md []prompb.MetricMetadata) error
}

// writeFamilyMetadata keeps the 1.0 metadata of families the server-side
// allowlist lets through by name alone, so it never reveals other names.
func (h *Handler) writeFamilyMetadata(tenant string, md []prompb.MetricMetadata) error {
	if len(md) == 0 || h.famW == nil {
		return nil
	}
	pol := h.policy.Load()
	kept := md[:0]
	for _, m := range md {
		if !model.LegacyValidation.IsValidMetricName(m.MetricFamilyName) || len(m.Help) > maxHelpBytes || len(m.Unit) > maxUnitBytes {
			h.metrics.rejected.WithLabelValues(reasonInvalidMetadata).Inc()
			continue
		}
		if pol.allows(tenant, []prompb.Label{{Name: model.MetricNameLabel, Value: m.MetricFamilyName}}) {
			kept = append(kept, m)
		}
	}
	if err := h.famW.WriteFamilyMetadata(tenant, kept); err != nil {
		return fmt.Errorf("write metadata: %w", err)
	}
	return nil
}

// rateLimitedError carries how long the client should wait.
type rateLimitedError struct {
	retryAfter time.Duration
	err        error
}

func (e *rateLimitedError) Error() string { return e.err.Error() }
func (e *rateLimitedError) Unwrap() error { return e.err }

// write validates and admits series, stores the valid ones, and reports
// the rest.
func (h *Handler) write(r *http.Request, id auth.Identity, lim *limits.TenantLimits, b *batch, proto string, rt route) (storage.Stats, error) {
	series := b.series
	valid := series[:0]
	var meta []metadata.Metadata
	if b.meta != nil && h.metaW != nil {
		meta = b.meta[:0] // compacted in step with valid
	}
	var problems []string
	rejected := 0
	pol := h.policy.Load()
	var sess sessions
	denied := h.denial(id)
	var dropped storage.Stats // allowlist misses on Telemeter's paths
	var hs *hintScratch
	if h.hintW != nil {
		hs = hintScratchPool.Get().(*hintScratch)
		defer hintScratchPool.Put(hs)
		hs.keys, hs.hints, hs.prev = hs.keys[:0], hs.hints[:0], hs.prev[:0]
	}
	for i := range series {
		ts := &series[i]
		n := len(ts.Samples) + len(ts.Histograms)
		var serr *seriesError
		var key limits.Key
		var hint uint64
		switch {
		case denied != nil && denied(ts): // first: an erased cluster leaves no trace on the status page
			serr = errErased
		case b.invalid != nil && b.invalid[i].serr != nil:
			serr, n = b.invalid[i].serr, b.invalid[i].samples
		default:
			key, hint, serr = h.admit(ts, id, lim, pol, &sess)
		}
		if serr != nil {
			rejected += n
			h.metrics.rejected.WithLabelValues(serr.reason).Add(float64(max(n, 1)))
			if serr.reason != reasonErased {
				sess.refuse(h.limiter, id, ts, serr.reason, n) // status page (track.go)
			}
			if rt.telemeter() && serr.reason == reasonAllowlist {
				// Dropped as telemeter-server drops it: counted, not refused,
				// and reported as written (telemeter.go).
				dropped.Samples += len(ts.Samples)
				dropped.Histograms += len(ts.Histograms)
				continue
			}
			if len(problems) < maxErrorsInBody {
				problems = append(problems, fmt.Sprintf("series %d: %s", i, serr.msg))
			}
			continue
		}
		valid = append(valid, *ts)
		if meta != nil {
			meta = append(meta, b.meta[i])
		}
		if hs != nil {
			hs.keys, hs.hints, hs.prev = append(hs.keys, key), append(hs.hints, hint), append(hs.prev, hint)
		}
	}
	sess.done(proto, r.UserAgent())
	h.metrics.seriesAccepted.Add(float64(len(valid)))

	var stats storage.Stats
	var werr error
	switch {
	case len(valid) == 0:
	case hs != nil:
		stats, werr = h.hintW.WriteHinted(r.Context(), id.Tenant, valid, meta, hs.hints)
		var perr *storage.PartialError
		if werr == nil || errors.As(werr, &perr) {
			for k, hint := range hs.hints {
				if hint != hs.prev[k] {
					h.limiter.SetHint(id.Tenant, hs.keys[k], hint)
				}
			}
		}
	case meta != nil:
		stats, werr = h.metaW.WriteWithMetadata(r.Context(), id.Tenant, valid, meta)
	default:
		stats, werr = h.writer.Write(r.Context(), id.Tenant, valid)
	}
	h.metrics.samples.WithLabelValues("accepted").Add(float64(stats.Samples))
	h.metrics.histograms.Add(float64(stats.Histograms))
	h.metrics.exemplars.Add(float64(stats.Exemplars))

	var perr *storage.PartialError
	switch {
	case werr == nil:
	case errors.As(werr, &perr):
		rejected += perr.Rejected
		h.metrics.rejected.WithLabelValues(reasonFor(werr)).Add(float64(perr.Rejected))
		problems = append(problems, werr.Error())
	default:
		return stats, fmt.Errorf("write: %w", werr)
	}
	h.metrics.samples.WithLabelValues("rejected").Add(float64(rejected))
	if stats.ExemplarsRefused > 0 {
		// Samples are stored; still not a 2xx, since something was not written.
		problems = append(problems, fmt.Sprintf("%d exemplars not stored (exemplar storage disabled, out of order or invalid)", stats.ExemplarsRefused))
	}
	if len(problems) == 0 {
		stats.Samples += dropped.Samples
		stats.Histograms += dropped.Histograms
		return stats, nil
	}
	err := &rejectedError{msg: rejectedMessage(rejected, stats.Samples+stats.Histograms, problems)}
	if werr != nil && len(problems) == 1 { // storage's refusal alone: its sentinel stays visible to errors.Is
		err.cause = werr
	}
	return stats, err
}

// rejectedError is a write whose samples were refused in part or whole: a
// 400 (errBadRequest) whose message is the client's answer, without
// "bad request" repeated after the reasons.
type rejectedError struct {
	msg   string
	cause error
}

func (e *rejectedError) Error() string { return e.msg }

func (e *rejectedError) Unwrap() []error {
	if e.cause == nil {
		return []error{errBadRequest}
	}
	return []error{errBadRequest, e.cause}
}

// rejectedMessage says how many samples were refused and why, and whether
// the others were written.
func rejectedMessage(rejected, written int, problems []string) string {
	outcome := "the rest were written"
	if written == 0 {
		outcome = "nothing was written"
	}
	return fmt.Sprintf("%d of %d samples rejected, %s: %s", rejected, rejected+written, outcome, strings.Join(problems, "; "))
}
