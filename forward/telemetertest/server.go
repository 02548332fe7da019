// Package telemetertest is a stand-in for a stock openshift/telemeter
// telemeter-server in tests: POST /authorize and POST /upload on loopback,
// checking what telemeter-server checks, on the wire as it does.
//
// /authorize reads the cluster id from the query or a url-encoded form (id),
// requires "Authorization: Bearer <fleet token>" and answers
// {"version":1,"token":...,"expiresInSeconds":N,"labels":{"_id":<id>}}.
// /upload requires a token it issued (else 401), decodes the body by its
// Content-Encoding (snappy: the framed stream format) and Content-Type (as
// expfmt.ResponseFormat reads it; only delimited MetricFamily protobufs are
// accepted here, which is what telemeter-client sends), and validates like
// telemeter-server: every metric has a timestamp, the metrics of a family
// are in timestamp order, every metric carries the token's labels with
// their values, names and label values are at most 255 bytes, the type's
// value field is set, and (with MaxAge) no sample is older than MaxAge.
// It answers as telemeter-server's pkg/server/validator.go does: 400 for a
// missing timestamp, metrics out of order, a sample too old or a missing
// required label; 500 for any other validation failure (a name or label
// too long, a required label with another value, a type mismatch) and for
// undecodable bodies; success 200. With RateLimit it takes one upload per
// cluster id in that window and answers 429 without Retry-After to the
// others, as telemeter-server's --ratelimit (pkg/server/ratelimited.go).
// Unlike telemeter-server it keeps the timestamps it received, so tests can
// check them.
package telemetertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/golang/snappy"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Server is a fake telemeter-server. Set the exported fields before the
// first request.
type Server struct {
	*httptest.Server

	FleetToken string        // the bearer token /authorize accepts
	IDLabel    string        // label bound to the id (telemeter-server's --cluster-id-key, default _id)
	Lifetime   int64         // expiresInSeconds of issued tokens (default 3600)
	MaxAge     time.Duration // 0: no age check
	LimitBytes int64         // 0: no limit on the decoded body; else 413 above it
	RateLimit  time.Duration // 0: none; else one upload per id in this window (telemeter-server's default: 4m30s)

	mu       sync.Mutex
	tokens   map[string]string // issued token → cluster id
	issued   int
	ids      []string
	uploads  int
	fail     []int
	families []*dto.MetricFamily
	sizes    []int // metrics per accepted upload
	rejected []string
	nextByID map[string]time.Time // RateLimit: when an id may upload again
}

// NewServer starts a Server accepting fleetToken. Close it when done.
func NewServer(fleetToken string) *Server {
	s := &Server{FleetToken: fleetToken, IDLabel: "_id", Lifetime: 3600, tokens: map[string]string{}, nextByID: map[string]time.Time{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/authorize", s.authorize)
	mux.HandleFunc("/upload", s.upload)
	s.Server = httptest.NewServer(mux)
	return s
}

// Expire invalidates every issued token: the next upload gets 401.
func (s *Server) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.tokens)
}

// FailNext makes the next uploads answer these status codes, in order.
func (s *Server) FailNext(codes ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = append(s.fail, codes...)
}

// AuthorizeIDs are the ids of every /authorize request, in order.
func (s *Server) AuthorizeIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...)
}

// Uploads is the number of /upload requests (accepted or not).
func (s *Server) Uploads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.uploads
}

// Families are the families of every accepted upload, in order.
func (s *Server) Families() []*dto.MetricFamily {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*dto.MetricFamily(nil), s.families...)
}

// UploadSizes are the numbers of metrics of the accepted uploads, in order.
func (s *Server) UploadSizes() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.sizes...)
}

// Rejections are the reasons of uploads answered 4xx/5xx, in order.
func (s *Server) Rejections() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.rejected...)
}

// Samples counts the metrics of every accepted upload.
func (s *Server) Samples() int {
	n := 0
	for _, mf := range s.Families() {
		n += len(mf.GetMetric())
	}
	return n
}

func (s *Server) authorize(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "Only POST is allowed to this endpoint", http.StatusMethodNotAllowed)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4*1024)
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := r.Form.Get("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, id)
	if id == "" {
		http.Error(w, "The 'id' parameter must be specified via URL or url-encoded form body", http.StatusBadRequest)
		return
	}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); !ok || tok != s.FleetToken {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	s.issued++
	tok := fmt.Sprintf("telemeter-token-%d", s.issued)
	s.tokens[tok] = id
	_ = json.NewEncoder(w).Encode(map[string]any{
		"version": 1, "token": tok, "expiresInSeconds": s.Lifetime,
		"labels": map[string]string{s.IDLabel: id},
	})
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	s.mu.Lock()
	s.uploads++
	id, ok := s.tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	var code int
	limited := false
	if ok && s.RateLimit > 0 { // behind authentication, before anything else
		now := time.Now()
		if limited = now.Before(s.nextByID[id]); !limited {
			s.nextByID[id] = now.Add(s.RateLimit)
		}
	}
	if ok && !limited && len(s.fail) > 0 {
		code, s.fail = s.fail[0], s.fail[1:]
	}
	s.mu.Unlock()
	reject := func(code int, msg string) {
		s.mu.Lock()
		s.rejected = append(s.rejected, fmt.Sprintf("%d %s", code, msg))
		s.mu.Unlock()
		http.Error(w, msg, code)
	}
	switch {
	case !ok:
		reject(http.StatusUnauthorized, "invalid token")
		return
	case limited:
		reject(http.StatusTooManyRequests, fmt.Sprintf("write limit reached for cluster with id %q", id))
		return
	case code != 0:
		reject(code, "injected failure")
		return
	}
	var body io.Reader = r.Body
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "snappy") {
		body = snappy.NewReader(r.Body) // the framed format, as telemeter-server reads it
	}
	if s.LimitBytes > 0 {
		body = io.LimitReader(body, s.LimitBytes+1)
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		reject(http.StatusInternalServerError, "failed to read request body: "+err.Error())
		return
	}
	if s.LimitBytes > 0 && int64(len(raw)) > s.LimitBytes {
		reject(http.StatusRequestEntityTooLarge, "failed to read request body")
		return
	}
	format := expfmt.ResponseFormat(r.Header)
	if format.FormatType() != expfmt.TypeProtoDelim {
		reject(http.StatusInternalServerError, fmt.Sprintf("failed to decode metrics: content type %q", r.Header.Get("Content-Type")))
		return
	}
	dec := expfmt.NewDecoder(strings.NewReader(string(raw)), format)
	var families []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			reject(http.StatusInternalServerError, "failed to decode metrics: "+err.Error())
			return
		}
		families = append(families, mf)
	}
	s.mu.Lock()
	required := map[string]string{s.IDLabel: id}
	s.mu.Unlock()
	minTS := int64(0)
	if s.MaxAge > 0 {
		minTS = time.Now().Add(-s.MaxAge).UnixMilli()
	}
	for _, mf := range families {
		if err := validate(mf, required, minTS); err != nil {
			code := http.StatusInternalServerError // "unexpected error during metrics transforming"
			if errors.Is(err, errClient) {
				code = http.StatusBadRequest
			}
			reject(code, err.Error())
			return
		}
	}
	n := 0
	for _, mf := range families {
		n += len(mf.GetMetric())
	}
	s.mu.Lock()
	s.families = append(s.families, families...)
	s.sizes = append(s.sizes, n)
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// errClient marks the validation errors telemeter-server answers 400 for:
// its sentinels ErrNoTimestamp, ErrUnsorted, ErrTimestampTooOld and
// ErrRequiredLabelMissing. It answers 500 for the others. It wraps
// without changing the message (it has none).
var errClient = errors.New("")

// validate applies telemeter-server's checks of one family.
func validate(mf *dto.MetricFamily, required map[string]string, minTS int64) error {
	name := mf.GetName()
	switch {
	case name == "":
		return nil // dropped, not an error
	case len(name) > 255:
		return errors.New("metrics_name cannot be longer than 255 characters")
	}
	var last int64
	for _, m := range mf.GetMetric() {
		ts := m.GetTimestampMs()
		switch {
		case ts == 0:
			return fmt.Errorf("metrics in provided family do not have a timestamp%w", errClient)
		case ts < last:
			return fmt.Errorf("metrics in provided family are not in increasing timestamp order%w", errClient)
		case ts < minTS:
			return fmt.Errorf("metrics in provided family have a timestamp that is too old, check clock skew%w", errClient)
		}
		last = ts
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			if len(l.GetName()) == 0 || len(l.GetName()) > 255 {
				return errors.New("label_name cannot be longer than 255 characters")
			}
			if len(l.GetValue()) > 255 {
				return errors.New("label_value cannot be longer than 255 characters")
			}
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range required {
			got, ok := have[k]
			if !ok {
				return fmt.Errorf("a required label is missing from the metric%w", errClient)
			}
			if got != v {
				return fmt.Errorf("expected label %s to have value %s instead of %s", k, v, got)
			}
		}
		set := 0
		for _, present := range []bool{m.Counter != nil, m.Gauge != nil, m.Untyped != nil, m.Histogram != nil, m.Summary != nil} {
			if present {
				set++
			}
		}
		var want bool
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			want = m.Counter != nil
		case dto.MetricType_GAUGE:
			want = m.Gauge != nil
		case dto.MetricType_UNTYPED:
			want = m.Untyped != nil
		case dto.MetricType_HISTOGRAM:
			want = m.Histogram != nil
		case dto.MetricType_SUMMARY:
			want = m.Summary != nil
		default:
			return fmt.Errorf("unknown metric type %s", mf.GetType())
		}
		if !want || set != 1 {
			return fmt.Errorf("metric type %s must have its field set", mf.GetType())
		}
	}
	return nil
}
