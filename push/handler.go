package push

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"golang.org/x/time/rate"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/storage"
)

// Patterns are the http.ServeMux patterns the Gateway serves, the
// Pushgateway's paths: the job plain or base64 encoded. GET /metrics stays
// the receiver's own metrics.
var Patterns = []string{
	"PUT /metrics/job/", "POST /metrics/job/",
	"PUT /metrics/job@base64/", "POST /metrics/job@base64/",
}

const (
	base64Suffix = "@base64"
	idLabel      = "_id"
	protoCT      = "application/vnd.google.protobuf"
)

// CountUnauthenticated counts a push that auth.Middleware refused; pass it
// as the middleware's onReject.
func (g *Gateway) CountUnauthenticated(_ *http.Request, err error) {
	code := auth.RejectStatus(err)
	reason := reasonUnauthenticated
	if code == http.StatusForbidden {
		reason = reasonForbidden
	}
	g.metrics.rejected.WithLabelValues(reason).Inc()
	g.metrics.requests.WithLabelValues(strconv.Itoa(code)).Inc()
}

// ServeHTTP accepts one push. The response is 200 with an empty body, like
// the Pushgateway's, or a short plain-text reason with 400, 413, 415, 429
// (with Retry-After), 503 or 500.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, err := g.handle(r)
	code := statusFor(err)
	g.metrics.requests.WithLabelValues(strconv.Itoa(code)).Inc()
	if err == nil {
		g.metrics.acceptedPushes.Inc()
		g.metrics.acceptedSample.Add(float64(n))
		w.WriteHeader(code)
		return
	}
	g.metrics.rejected.WithLabelValues(reasonOf(err)).Inc()
	var rj *rejection
	if errors.As(err, &rj) && rj.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(rj.retryAfter.Seconds()))))
	}
	if code >= 500 {
		g.logger.Error("push failed", "err", err)
	} else {
		g.logger.Debug("push rejected", "reason", reasonOf(err), "err", err)
	}
	http.Error(w, err.Error(), code)
}

func (g *Gateway) handle(r *http.Request) (int, error) {
	id, ok := auth.FromContext(r.Context())
	if !ok || id.Tenant == "" {
		return 0, reject(reasonUnauthenticated, errInvalid, "no identity: the push endpoint must be mounted behind authentication")
	}
	if id.ClusterID != "" && g.denied != nil && g.denied(id.Tenant, id.ClusterID) {
		return 0, reject(reasonErased, errInvalid, "%s", storage.ClusterErasedRefusal)
	}
	key := rateKey(id.Tenant, r.Header.Get("Authorization"))
	if ok, wait := g.limiter.allow(key, g.now()); !ok {
		rj := reject(reasonRateLimited, errRateLimited, "push rate limit exceeded (push.rate_limit); retry later")
		rj.retryAfter = max(wait, time.Second)
		return 0, rj
	}
	rec, err := g.parse(r, id)
	if err != nil {
		return 0, err
	}
	return len(rec.Samples), g.accept(rec)
}

// parse turns a push request into the record it would add; it touches no
// state (FuzzPushRequest).
func (g *Gateway) parse(r *http.Request, id auth.Identity) (*record, error) {
	grouping, err := parsePath(r.URL.EscapedPath())
	if err != nil {
		return nil, err
	}
	fams, err := g.decode(r)
	if err != nil {
		return nil, err
	}
	return g.buildRecord(id, grouping, fams)
}

// parsePath returns the grouping labels of a Pushgateway path:
// /metrics/job/<job>{/<label>/<value>}, where "<name>@base64" marks a
// base64url-encoded value (a single "=" is the empty value).
func parsePath(escaped string) ([]labels.Label, error) {
	rest, ok := strings.CutPrefix(escaped, "/metrics/")
	if !ok {
		return nil, reject(reasonInvalidPath, errInvalid, "path must be /metrics/job/<job>{/<label>/<value>}")
	}
	rest = strings.TrimSuffix(rest, "/")
	segs := strings.Split(rest, "/")
	if len(segs)%2 != 0 {
		return nil, reject(reasonInvalidPath, errInvalid, "path %q: every label name needs a value", escaped)
	}
	out := make([]labels.Label, 0, len(segs)/2)
	seen := map[string]bool{}
	for i := 0; i < len(segs); i += 2 {
		name, err := url.PathUnescape(segs[i])
		if err != nil {
			return nil, reject(reasonInvalidPath, errInvalid, "path segment %q: %v", segs[i], err)
		}
		value, err := url.PathUnescape(segs[i+1])
		if err != nil {
			return nil, reject(reasonInvalidPath, errInvalid, "path segment %q: %v", segs[i+1], err)
		}
		if n, ok := strings.CutSuffix(name, base64Suffix); ok {
			b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(value, "="))
			if err != nil {
				return nil, reject(reasonInvalidPath, errInvalid, "label %s: value %q is not base64url: %v", n, value, err)
			}
			name, value = n, string(b)
		}
		switch {
		case i == 0 && name != "job":
			return nil, reject(reasonInvalidPath, errInvalid, "path must start with /metrics/job/<job>")
		case i == 0 && value == "":
			return nil, reject(reasonInvalidPath, errInvalid, "the job name must not be empty")
		case !model.LegacyValidation.IsValidLabelName(name) || strings.HasPrefix(name, "__"):
			return nil, reject(reasonInvalidLabel, errInvalid, "grouping label name %q is invalid", name)
		case seen[name]:
			return nil, reject(reasonInvalidPath, errInvalid, "grouping label %s appears twice in the path", name)
		}
		seen[name] = true
		out = append(out, labels.Label{Name: name, Value: value})
	}
	return out, nil
}

// decode reads and parses the body: the text format (any content type but
// protobuf, as curl sends application/x-www-form-urlencoded) or delimited
// protobuf MetricFamily messages.
func (g *Gateway) decode(r *http.Request) ([]*dto.MetricFamily, error) {
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return nil, reject(reasonUnsupported, errUnsupported, "content-encoding %q is not supported; send the body uncompressed", enc)
	}
	isProto := false
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil {
			return nil, reject(reasonUnsupported, errUnsupported, "content-type %q: %v", ct, err)
		}
		switch mt {
		case protoCT:
			if params["proto"] != "io.prometheus.client.MetricFamily" || params["encoding"] != "delimited" {
				return nil, reject(reasonUnsupported, errUnsupported, "content-type %q: want proto=io.prometheus.client.MetricFamily; encoding=delimited", ct)
			}
			isProto = true
		case "text/plain", "application/x-www-form-urlencoded", "application/octet-stream":
			if v, ok := params["version"]; ok && v != expfmt.TextVersion {
				return nil, reject(reasonUnsupported, errUnsupported, "content-type %q: only text format version %s is supported", ct, expfmt.TextVersion)
			}
		default:
			return nil, reject(reasonUnsupported, errUnsupported, "content-type %q is not supported; send the text format (text/plain; version=0.0.4) or delimited protobuf", ct)
		}
	}
	limit := int64(g.cfg.MaxBodyBytes)
	if r.ContentLength > limit {
		return nil, reject(reasonTooLarge, errTooLarge, "body of %d bytes exceeds push.max_body_bytes (%d)", r.ContentLength, limit)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, reject(reasonParse, errInvalid, "read body: %v", err)
	}
	if int64(len(body)) > limit {
		return nil, reject(reasonTooLarge, errTooLarge, "body exceeds push.max_body_bytes (%d)", limit)
	}
	if !isProto {
		p := expfmt.NewTextParser(model.LegacyValidation)
		m, err := p.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			return nil, reject(reasonParse, errInvalid, "parse text format: %v", err)
		}
		out := make([]*dto.MetricFamily, 0, len(m))
		for _, mf := range m {
			out = append(out, mf)
		}
		return out, nil
	}
	dec := expfmt.NewDecoder(bytes.NewReader(body), expfmt.NewFormat(expfmt.TypeProtoDelim))
	var out []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, reject(reasonParse, errInvalid, "parse delimited protobuf: %v", err)
		}
		out = append(out, mf)
	}
}

var typeNames = map[dto.MetricType]string{
	dto.MetricType_COUNTER:   "counter",
	dto.MetricType_GAUGE:     "gauge",
	dto.MetricType_HISTOGRAM: "histogram",
}

// buildRecord validates a push and turns it into the samples it adds.
func (g *Gateway) buildRecord(id auth.Identity, grouping []labels.Label, fams []*dto.MetricFamily) (*record, error) {
	rec := &record{Tenant: id.Tenant, Types: map[string]string{}, Layouts: map[string]string{}}
	// The push's own table: a refused push must not grow the state's
	// (ts.apply interns the labels of the series it keeps).
	syms := labels.NewSymbolTable()
	for _, mf := range fams {
		name := mf.GetName()
		if !g.allowed[name] {
			return nil, reject(reasonNotAllowed, errInvalid, "metric %q is not in the push allowlist (push.allowed_metrics)", name)
		}
		typ, ok := typeNames[mf.GetType()]
		switch {
		case mf.GetType() == dto.MetricType_UNTYPED:
			return nil, reject(reasonUntyped, errInvalid, "metric %q is untyped: declare it with \"# TYPE %s counter\" (or gauge, histogram); untyped series cannot be aggregated", name, name)
		case !ok:
			return nil, reject(reasonUnsupportedType, errInvalid, "metric %q is a %s; only counters, gauges and classic histograms can be aggregated", name, strings.ToLower(mf.GetType().String()))
		}
		if have, ok := rec.Types[name]; ok && have != typ {
			return nil, reject(reasonTypeMismatch, errInvalid, "metric %q appears as a %s and a %s in one push", name, have, typ)
		}
		rec.Types[name] = typ
		for _, m := range mf.GetMetric() {
			base, err := g.seriesLabels(syms, id, name, typ, grouping, m.GetLabel())
			if err != nil {
				return nil, err
			}
			if err := g.addSamples(rec, name, typ, base, m); err != nil {
				return nil, err
			}
			if len(rec.Samples) > g.cfg.MaxSeriesPerPush {
				return nil, reject(reasonTooLarge, errTooLarge, "push has more than push.max_series_per_push (%d) samples", g.cfg.MaxSeriesPerPush)
			}
		}
	}
	return rec, nil
}

// seriesLabels merges a metric's labels with the grouping labels and
// validates them. The result has no metric name.
func (g *Gateway) seriesLabels(syms *labels.SymbolTable, id auth.Identity, name, typ string, grouping []labels.Label, pairs []*dto.LabelPair) (labels.Labels, error) {
	b := labels.NewScratchBuilderWithSymbolTable(syms, len(pairs)+len(grouping)+1)
	seen := make(map[string]string, len(pairs)+len(grouping))
	check := func(n, v string) error {
		switch {
		case !model.LegacyValidation.IsValidLabelName(n) || strings.HasPrefix(n, "__"):
			return reject(reasonInvalidLabel, errInvalid, "metric %s: label name %q is invalid", name, n)
		case len(n) > g.cfg.MaxLabelNameLength:
			return reject(reasonInvalidLabel, errInvalid, "metric %s: label name %.32q... is longer than push.max_label_name_length (%d)", name, n, g.cfg.MaxLabelNameLength)
		case len(v) > g.cfg.MaxLabelValueLength:
			return reject(reasonInvalidLabel, errInvalid, "metric %s: value of label %s is longer than push.max_label_value_length (%d)", name, n, g.cfg.MaxLabelValueLength)
		case !utf8.ValidString(v):
			return reject(reasonInvalidLabel, errInvalid, "metric %s: value of label %s is not valid UTF-8", name, n)
		case typ == "histogram" && n == model.BucketLabel:
			return reject(reasonInvalidLabel, errInvalid, "metric %s: label le is reserved for histogram buckets", name)
		case n == ReplicaLabel:
			return reject(reasonInvalidLabel, errInvalid, "metric %s: label %s is reserved: the receiver sets it to tell its replicas' partial sums apart", name, ReplicaLabel)
		}
		return nil
	}
	for _, lp := range pairs {
		n, v := lp.GetName(), lp.GetValue()
		if err := check(n, v); err != nil {
			return labels.EmptyLabels(), err
		}
		if _, dup := seen[n]; dup {
			return labels.EmptyLabels(), reject(reasonInvalidLabel, errInvalid, "metric %s: label %s appears twice", name, n)
		}
		seen[n] = v
	}
	for _, gl := range grouping {
		if err := check(gl.Name, gl.Value); err != nil {
			return labels.EmptyLabels(), err
		}
		if v, ok := seen[gl.Name]; ok && v != gl.Value {
			return labels.EmptyLabels(), reject(reasonLabelConflict, errInvalid, "metric %s: label %s=%q conflicts with the grouping label %s=%q in the path", name, gl.Name, v, gl.Name, gl.Value)
		}
		seen[gl.Name] = gl.Value
	}
	if v, ok := seen[idLabel]; ok && v != id.ClusterID {
		return labels.EmptyLabels(), reject(reasonClusterID, errInvalid, "metric %s: label _id does not match the credential's cluster", name)
	}
	if id.ClusterID != "" {
		seen[idLabel] = id.ClusterID
	}
	if len(seen) > g.cfg.MaxLabelsPerSeries {
		return labels.EmptyLabels(), reject(reasonInvalidLabel, errInvalid, "metric %s: %d labels exceed push.max_labels_per_series (%d)", name, len(seen), g.cfg.MaxLabelsPerSeries)
	}
	for n, v := range seen {
		b.Add(n, v)
	}
	b.Sort()
	return b.Labels(), nil
}

func withName(base labels.Labels, name string, extra ...string) labels.Labels {
	b := labels.NewBuilder(base)
	b.Set(model.MetricNameLabel, name)
	for i := 0; i+1 < len(extra); i += 2 {
		b.Set(extra[i], extra[i+1])
	}
	return b.Labels()
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func (g *Gateway) addSamples(rec *record, name, typ string, base labels.Labels, m *dto.Metric) error {
	switch typ {
	case "counter":
		v := m.GetCounter().GetValue()
		if !finite(v) || v < 0 {
			return reject(reasonInvalidValue, errInvalid, "counter %s: value %g must be finite and not negative", name, v)
		}
		rec.Samples = append(rec.Samples, delta{Labels: withName(base, name), Value: v})
	case "gauge":
		v := m.GetGauge().GetValue()
		if !finite(v) {
			return reject(reasonInvalidValue, errInvalid, "gauge %s: value %g must be finite", name, v)
		}
		rec.Samples = append(rec.Samples, delta{Labels: withName(base, name), Value: v, Set: g.cfg.GaugePolicy == GaugeLast})
	case "histogram":
		h := m.GetHistogram()
		if len(h.GetBucket()) == 0 && (h.Schema != nil || len(h.GetPositiveSpan()) > 0 || len(h.GetNegativeSpan()) > 0) {
			return reject(reasonUnsupportedType, errInvalid, "histogram %s: native histograms cannot be aggregated; push classic buckets", name)
		}
		count := h.GetSampleCountFloat()
		if count == 0 {
			count = float64(h.GetSampleCount())
		}
		sum := h.GetSampleSum()
		if !finite(sum) || !finite(count) || count < 0 {
			return reject(reasonInvalidValue, errInvalid, "histogram %s: sum and count must be finite", name)
		}
		var bounds []string
		prevUB, prevC := math.Inf(-1), 0.0
		for _, bk := range h.GetBucket() {
			ub := bk.GetUpperBound()
			c := bk.GetCumulativeCountFloat()
			if c == 0 {
				c = float64(bk.GetCumulativeCount())
			}
			if math.IsNaN(ub) || ub <= prevUB || !finite(c) || c < prevC || c > count {
				return reject(reasonInvalidValue, errInvalid, "histogram %s: buckets must have increasing bounds and non-decreasing counts up to the total count", name)
			}
			prevUB, prevC = ub, c
			le := model.FloatString(ub).String()
			if math.IsInf(ub, 1) {
				le = "+Inf"
			}
			bounds = append(bounds, le)
			rec.Samples = append(rec.Samples, delta{Labels: withName(base, name+"_bucket", model.BucketLabel, le), Value: c})
		}
		if !math.IsInf(prevUB, 1) {
			bounds = append(bounds, "+Inf")
			rec.Samples = append(rec.Samples, delta{Labels: withName(base, name+"_bucket", model.BucketLabel, "+Inf"), Value: count})
		}
		layout := strings.Join(bounds, ",")
		k := withName(base, name).String()
		if have, ok := rec.Layouts[k]; ok && have != layout {
			return reject(reasonBucketMismatch, errInvalid, "histogram %s: one push has two bucket layouts for %s", name, k)
		}
		rec.Layouts[k] = layout
		rec.Samples = append(rec.Samples,
			delta{Labels: withName(base, name+"_sum"), Value: sum},
			delta{Labels: withName(base, name+"_count"), Value: count})
	}
	return nil
}

// limiter is a token bucket per credential. It forgets every bucket when it
// holds maxLimiters, which bounds memory at the price of a fresh burst.
type limiter struct {
	mu    sync.Mutex
	r     rate.Limit
	burst int
	m     map[string]*rate.Limiter
}

const maxLimiters = 10000

// rateKey identifies the credential a push is limited by: the tenant and the
// parsed bearer token, so reformatting the header ("bearer  x") does not buy
// a fresh bucket.
func rateKey(tenant, authorization string) string {
	token, ok := auth.ParseBearer(authorization)
	if !ok {
		token = authorization
	}
	sum := sha256.Sum256([]byte(tenant + "\x00" + token))
	return hex.EncodeToString(sum[:16])
}

// evict makes room: buckets that have refilled are the same as new ones, so
// dropping them changes nothing; if none has, one arbitrary bucket goes.
func (l *limiter) evict(now time.Time) {
	for k, lim := range l.m {
		if lim.TokensAt(now) >= float64(l.burst) {
			delete(l.m, k)
		}
	}
	for k := range l.m {
		if len(l.m) < maxLimiters {
			return
		}
		delete(l.m, k)
	}
}

func newLimiter(cfg RateLimit) *limiter {
	return &limiter{r: rate.Limit(cfg.RequestsPerSecond), burst: cfg.Burst, m: map[string]*rate.Limiter{}}
}

func (l *limiter) allow(key string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.m[key]
	if !ok {
		if len(l.m) >= maxLimiters {
			l.evict(now)
		}
		lim = rate.NewLimiter(l.r, l.burst)
		l.m[key] = lim
	}
	res := lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return false, d
	}
	return true, 0
}
