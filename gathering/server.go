package gathering

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/phonehome/phonehome/allowlist"
)

// Server is the receiver's side: it loads the definition from a YAML file,
// re-reads it when it changes (Reload, Run), keeps the last good definition
// when a new version is invalid (logged and counted), remembers the previous
// definition for a grace period, and serves the current one over HTTP.
// Safe for concurrent use.
type Server struct {
	logger   *slog.Logger
	path     string
	grace    time.Duration
	onChange func()
	now      func() time.Time

	reloadMu sync.Mutex // serializes Reload
	fileHash [sha256.Size]byte
	state    atomic.Pointer[serverState]

	reloads    *prometheus.CounterVec
	lastReload prometheus.Gauge
	info       *prometheus.GaugeVec
	requests   *prometheus.CounterVec
}

type serverState struct {
	cur, prev *Compiled // prev is nil until the first change
	changed   time.Time // when cur replaced prev
}

// ServerOptions configures a Server.
type ServerOptions struct {
	// GracePeriod is how long, after a change, the previous definition's
	// selectors are still accepted server-side (see Allowlists).
	GracePeriod time.Duration
	// OnChange is called after every change of the definition in force
	// (not at construction), e.g. to recompute the server-side policy.
	OnChange func()
}

// NewServer loads path, which must hold a valid definition. reg may be nil.
func NewServer(logger *slog.Logger, reg prometheus.Registerer, path string, opts ServerOptions) (*Server, error) {
	f := promauto.With(reg)
	s := &Server{
		logger: logger, path: path, grace: opts.GracePeriod, onChange: opts.OnChange, now: time.Now,
		reloads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_gathering_reloads_total",
			Help: "Reloads of the gathering definition file that changed it, by result (success, failure).",
		}, []string{"result"}),
		lastReload: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_gathering_last_reload_success_timestamp_seconds",
			Help: "When the gathering definition in force was loaded.",
		}),
		info: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "phonehome_gathering_served_definition_info",
			Help: "The gathering definition served (value 1), by version and ETag.",
		}, []string{"version", "etag"}),
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_gathering_requests_total",
			Help: "GET /api/v1/gathering requests by HTTP status code.",
		}, []string{"code"}),
	}
	for _, r := range []string{"success", "failure"} {
		s.reloads.WithLabelValues(r)
	}
	for _, c := range []string{"200", "304"} {
		s.requests.WithLabelValues(c)
	}
	c, sum, err := s.load()
	if err != nil {
		return nil, err
	}
	s.fileHash = sum
	s.state.Store(&serverState{cur: c})
	s.info.WithLabelValues(c.Def.Version, c.ETag).Set(1)
	s.lastReload.SetToCurrentTime()
	return s, nil
}

// Load validates the definition file at path (for --check-config).
func Load(path string) (*Compiled, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read gathering definition: %w", err)
	}
	d, err := DecodeYAML(b)
	if err != nil {
		return nil, fmt.Errorf("gathering definition %s: %w", path, err)
	}
	return Compile(d)
}

func (s *Server) load() (*Compiled, [sha256.Size]byte, error) {
	b, err := os.ReadFile(s.path)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("read gathering definition: %w", err)
	}
	sum := sha256.Sum256(b)
	d, err := DecodeYAML(b)
	if err != nil {
		return nil, sum, fmt.Errorf("gathering definition %s: %w", s.path, err)
	}
	c, err := Compile(d)
	return c, sum, err
}

// Reload re-reads the file if its bytes changed. An invalid version is
// logged and counted, and the definition in force stays.
func (s *Server) Reload() {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if b, err := os.ReadFile(s.path); err == nil && sha256.Sum256(b) == s.fileHash {
		return
	}
	c, sum, err := s.load()
	if err != nil {
		s.reloads.WithLabelValues("failure").Inc()
		s.logger.Error("reload gathering definition, keeping the previous one", "file", s.path, "err", err)
		return
	}
	s.fileHash = sum
	old := s.state.Load()
	if c.ETag == old.cur.ETag { // reformatted, same content
		return
	}
	s.state.Store(&serverState{cur: c, prev: old.cur, changed: s.now()})
	s.info.Reset()
	s.info.WithLabelValues(c.Def.Version, c.ETag).Set(1)
	s.reloads.WithLabelValues("success").Inc()
	s.lastReload.SetToCurrentTime()
	s.logger.Info("gathering definition changed", "file", s.path, "version", c.Def.Version, "previous", old.cur.Def.Version,
		"previous_accepted_until", s.now().Add(s.grace).UTC().Format(time.RFC3339))
	if s.onChange != nil {
		s.onChange()
	}
}

// Run reloads every interval and whenever hup delivers, until ctx ends.
func (s *Server) Run(ctx context.Context, interval time.Duration, hup <-chan os.Signal) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Reload()
		case <-hup:
			s.Reload()
		}
	}
}

// Current returns the definition in force.
func (s *Server) Current() *Compiled { return s.state.Load().cur }

// Allowlists returns the selectors the receiver accepts: those of the
// definition in force and, until prevUntil, those of the previous one (nil
// if there is none).
func (s *Server) Allowlists() (cur, prev *allowlist.List, prevUntil time.Time) {
	st := s.state.Load()
	if st.prev == nil {
		return st.cur.Allow, nil, time.Time{}
	}
	return st.cur.Allow, st.prev.Allow, st.changed.Add(s.grace)
}

// ServeHTTP serves GET (and HEAD) /api/v1/gathering: the definition in force
// as JSON with a strong ETag; If-None-Match with that ETag gets 304 and no
// body. The caller must be authenticated (any credential of a tenant).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := s.Current()
	h := w.Header()
	h.Set("ETag", c.ETag)
	h.Set("Cache-Control", "no-cache")
	if etagMatches(r.Header.Get("If-None-Match"), c.ETag) {
		s.requests.WithLabelValues("304").Inc()
		w.WriteHeader(http.StatusNotModified)
		return
	}
	s.requests.WithLabelValues("200").Inc()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(c.Body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(c.Body)
	}
}

// etagMatches implements If-None-Match's weak comparison (RFC 9110 13.1.2)
// against a strong etag: "*" or any listed tag, W/ prefix ignored.
func etagMatches(header, etag string) bool {
	if header == "" {
		return false
	}
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimSpace(t)
		if t == "*" || strings.TrimPrefix(t, "W/") == etag {
			return true
		}
	}
	return false
}
