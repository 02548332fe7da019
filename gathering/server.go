package gathering

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/internal/periodic"
)

// DefaultTenant is the value of the tenant label of the server's metrics for
// the default definition. It is not a valid tenant name (auth.ValidTenant).
const DefaultTenant = "*"

// Files names the definition files a Server serves: Default for every
// tenant without a file of its own in Tenants (tenant → file). Either may
// be empty; a tenant with neither is served 404 and nothing is enforced
// for it (but the grace periods of removed definitions, see
// ServerOptions.StateDir).
type Files struct {
	Default string
	Tenants map[string]string
}

// Server is the receiver's side: it loads one definition per configured
// tenant (and a default) from YAML files, re-reads each file when it changes
// (Reload, Run), keeps a tenant's last good definition when a new version is
// invalid (logged and counted), remembers the versions each tenant's
// definition replaced, each for a grace period from its replacement (at
// most MaxPrevious) — persisted under ServerOptions.StateDir so that they
// survive a restart, as do the last versions of a definition whose file
// was removed from the configuration (a tenant's own, or the default) —
// and serves the caller's tenant's definition over HTTP. The set of
// tenants is fixed at construction. Safe for concurrent use.
//
// The reload, reload-timestamp and served-definition metrics carry a tenant
// label: its values are the tenants named in the configuration (and
// DefaultTenant), a small set chosen by the operator, not the tenants of
// the requests.
type Server struct {
	logger   *slog.Logger
	grace    time.Duration
	onChange func()
	now      func() time.Time

	// def is the default: its file, or an orphan (its file removed from
	// the configuration, restoreOrphan) while its state lasts; nil if
	// neither.
	def     *source
	tenants map[string]*source // immutable after NewServer
	// orphans are the tenants with a state file but no definition file
	// (restoreOrphans): no definition in force, only previous versions.
	// Immutable after NewServer.
	orphans map[string]*source

	reloads    *prometheus.CounterVec
	lastReload *prometheus.GaugeVec
	info       *prometheus.GaugeVec
	requests   *prometheus.CounterVec
}

// source is one definition file and its state.
type source struct {
	tenant    string     // the metrics' tenant label: the tenant, or DefaultTenant
	path      string     // "" for an orphan
	statePath string     // "" without ServerOptions.StateDir
	reloadMu  sync.Mutex // serializes reload; guards fileHash
	fileHash  [sha256.Size]byte
	state     atomic.Pointer[serverState]
}

// orphan reports whether src is a definition no longer configured: no
// file, no definition in force, only previous versions.
func (src *source) orphan() bool { return src.path == "" }

type serverState struct {
	cur  *Compiled  // nil for an orphan
	prev []replaced // newest first: see Server.history
}

// ServerOptions configures a Server.
type ServerOptions struct {
	// GracePeriod is how long, after a change, the replaced definition's
	// selectors are still accepted server-side (see Allowlists).
	GracePeriod time.Duration
	// OnChange is called after every change of a definition in force, and
	// when the last grace period of a removed one ends (not at
	// construction), e.g. to recompute the server-side policy.
	OnChange func()
	// StateDir, when set, is where each tenant's current definition and
	// the versions it replaced, with when, are persisted (written
	// atomically at start and on every change) and restored from at
	// construction,
	// so the grace period survives a restart; a file there outlives its
	// definition file (a tenant's, or the default's) by a grace period
	// (see Allowlists). Created if missing.
	StateDir string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Allowlists is one definition's selectors as enforced server-side: the
// definition in force and the versions it replaced that are still within
// their grace period.
type Allowlists struct {
	// Cur is nil for a definition whose file was removed from the
	// configuration (the default's, or a tenant's own without a default):
	// no definition is in force (the config's allowlist alone applies),
	// only Prev.
	Cur  *allowlist.List
	Prev []Previous // newest first
}

// Previous is a replaced version's selectors, accepted until Until.
type Previous struct {
	Allow *allowlist.List
	Until time.Time
}

// NewServer loads every file of files, each of which must hold a valid
// definition, and restores the previous definitions from opts.StateDir.
// files may be empty only with a StateDir (see HasState). reg may be nil.
func NewServer(logger *slog.Logger, reg prometheus.Registerer, files Files, opts ServerOptions) (*Server, error) {
	if files.Default == "" && len(files.Tenants) == 0 && opts.StateDir == "" {
		return nil, errors.New("no gathering definition file")
	}
	f := promauto.With(reg)
	s := &Server{
		logger: logger, grace: opts.GracePeriod, onChange: opts.OnChange, now: opts.Now,
		tenants: make(map[string]*source, len(files.Tenants)),
		reloads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_gathering_reloads_total",
			Help: "Reloads of a gathering definition file that changed it, by tenant (* for the default) and result (success, failure).",
		}, []string{"tenant", "result"}),
		lastReload: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "phonehome_gathering_last_reload_success_timestamp_seconds",
			Help: "When the gathering definition in force was loaded, by tenant (* for the default).",
		}, []string{"tenant"}),
		info: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "phonehome_gathering_served_definition_info",
			Help: "The gathering definition served (value 1), by tenant (* for the default), version and ETag.",
		}, []string{"tenant", "version", "etag"}),
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_gathering_requests_total",
			Help: "GET /api/v1/gathering requests by HTTP status code.",
		}, []string{"code"}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	for _, c := range []string{"200", "304", "404"} {
		s.requests.WithLabelValues(c)
	}
	if opts.StateDir != "" {
		if err := os.MkdirAll(opts.StateDir, 0o750); err != nil {
			return nil, fmt.Errorf("create gathering state dir: %w", err)
		}
		if err := removeStaleState(s.logger, opts.StateDir); err != nil {
			return nil, err
		}
	}
	var errs []error
	add := func(tenant, path string) *source {
		src := &source{tenant: tenant, path: path}
		if opts.StateDir != "" {
			src.statePath = statePath(opts.StateDir, tenant)
		}
		if err := s.open(src); err != nil {
			errs = append(errs, err)
		}
		return src
	}
	switch {
	case files.Default != "":
		s.def = add(DefaultTenant, files.Default)
	case opts.StateDir != "":
		s.def = s.restoreOrphan(opts.StateDir, DefaultTenant) // before the tenants, as add is
	}
	for _, t := range slices.Sorted(maps.Keys(files.Tenants)) {
		s.tenants[t] = add(t, files.Tenants[t])
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if opts.StateDir != "" {
		s.orphans = s.restoreOrphans(opts.StateDir, files.Tenants)
	}
	return s, nil
}

// open loads src's file and restores its previous definition.
func (s *Server) open(src *source) error {
	c, sum, err := src.load()
	if err != nil {
		return err
	}
	src.fileHash = sum
	st := &serverState{cur: c}
	if src.statePath != "" {
		st = s.restore(src, c)
	}
	src.state.Store(st)
	s.reloads.WithLabelValues(src.tenant, "success")
	s.reloads.WithLabelValues(src.tenant, "failure")
	s.info.WithLabelValues(src.tenant, c.Def.Version, c.ETag).Set(1)
	s.lastReload.WithLabelValues(src.tenant).Set(float64(s.now().UnixNano()) / 1e9)
	return nil
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

func (src *source) load() (*Compiled, [sha256.Size]byte, error) {
	b, err := os.ReadFile(src.path)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("read gathering definition: %w", err)
	}
	sum := sha256.Sum256(b)
	d, err := DecodeYAML(b)
	if err != nil {
		return nil, sum, fmt.Errorf("gathering definition %s: %w", src.path, err)
	}
	c, err := Compile(d)
	if err != nil {
		return nil, sum, fmt.Errorf("gathering definition %s: %w", src.path, err)
	}
	return c, sum, nil
}

// Reload re-reads every file whose bytes changed. An invalid version is
// logged, counted and returned (every file's, joined), and that tenant's
// definition in force stays; the other tenants are not affected. It also
// deletes the state of the definitions no longer configured whose grace
// periods have all ended. OnChange is called once if any of this happened.
func (s *Server) Reload() error {
	changed := false
	var errs []error
	for _, src := range s.sources() {
		c, err := s.reload(src)
		changed = c || changed
		errs = append(errs, err)
	}
	for _, src := range s.orphanSources() {
		changed = s.expire(src) || changed
	}
	if changed && s.onChange != nil {
		s.onChange()
	}
	return errors.Join(errs...)
}

// sources returns the configured definitions: the default's, then the
// tenants' in order.
func (s *Server) sources() []*source {
	out := make([]*source, 0, len(s.tenants)+1)
	if s.def != nil && !s.def.orphan() {
		out = append(out, s.def)
	}
	for _, t := range slices.Sorted(maps.Keys(s.tenants)) {
		out = append(out, s.tenants[t])
	}
	return out
}

// orphanSources returns the definitions no longer configured.
func (s *Server) orphanSources() []*source {
	out := slices.Collect(maps.Values(s.orphans))
	if s.def != nil && s.def.orphan() {
		out = append(out, s.def)
	}
	return out
}

// reload reports whether src's definition in force changed, or why the
// new version was refused.
func (s *Server) reload(src *source) (bool, error) {
	src.reloadMu.Lock()
	defer src.reloadMu.Unlock()
	if b, err := os.ReadFile(src.path); err == nil && sha256.Sum256(b) == src.fileHash {
		return false, nil
	}
	c, sum, err := src.load()
	if err != nil {
		s.reloads.WithLabelValues(src.tenant, "failure").Inc()
		s.logger.Error("reload gathering definition, keeping the previous one", "tenant", src.tenant, "file", src.path, "err", err)
		return false, err
	}
	src.fileHash = sum
	old := src.state.Load()
	if c.ETag == old.cur.ETag { // reformatted, same content
		return false, nil
	}
	now := s.now()
	st := &serverState{cur: c, prev: s.history(src, c, append([]replaced{{def: old.cur, at: now}}, old.prev...), now)}
	src.state.Store(st)
	s.persist(src, st)
	s.info.DeletePartialMatch(prometheus.Labels{"tenant": src.tenant})
	s.info.WithLabelValues(src.tenant, c.Def.Version, c.ETag).Set(1)
	s.reloads.WithLabelValues(src.tenant, "success").Inc()
	s.lastReload.WithLabelValues(src.tenant).Set(float64(now.UnixNano()) / 1e9)
	s.logger.Info("gathering definition changed", "tenant", src.tenant, "file", src.path, "version", c.Def.Version,
		"previous", old.cur.Def.Version, "previous_accepted_until", now.Add(s.grace).UTC().Format(time.RFC3339), "previous_versions", len(st.prev))
	return true, nil
}

// Run reloads every interval until ctx ends (SIGHUP and POST /-/reload
// call Reload: the receiver's reloadOnSIGHUP, reloadHandler).
func (s *Server) Run(ctx context.Context, interval time.Duration) error {
	periodic.Every(ctx, interval, func(context.Context) { _ = s.Reload() }) // logged and counted
	return nil
}

// source returns tenant's source: its own, else the default (nil if none).
func (s *Server) source(tenant string) *source {
	if src, ok := s.tenants[tenant]; ok {
		return src
	}
	return s.def
}

// Current returns the definition in force for tenant (its own, else the
// default), or nil if there is none.
func (s *Server) Current(tenant string) *Compiled {
	src := s.source(tenant)
	if src == nil {
		return nil
	}
	return src.state.Load().cur
}

// Allowlists returns the selectors the receiver accepts: those of the
// default definition (nil without one) and those of each tenant with a
// definition of its own, each with its versions still in their grace
// period. A default whose file was removed from the configuration is def
// without Cur until the grace periods of its last versions end, then nil.
// A tenant whose own file was removed is in tenants until the grace
// periods of its last versions end: the default's selectors (none without
// a default) and, in Prev, its own last versions and the default's. The
// map is the caller's.
func (s *Server) Allowlists() (def *Allowlists, tenants map[string]Allowlists) {
	now := s.now()
	if s.def != nil {
		if a := s.allowlists(s.def, now); a.Cur != nil || len(a.Prev) > 0 {
			def = &a
		}
	}
	tenants = make(map[string]Allowlists, len(s.tenants)+len(s.orphans))
	for t, src := range s.tenants {
		tenants[t] = s.allowlists(src, now)
	}
	for t, src := range s.orphans {
		a := s.allowlists(src, now)
		if len(a.Prev) == 0 {
			continue // held to the default alone
		}
		if def != nil {
			a.Cur, a.Prev = def.Cur, append(a.Prev, def.Prev...)
		}
		tenants[t] = a
	}
	return def, tenants
}

func (s *Server) allowlists(src *source, now time.Time) Allowlists {
	st := src.state.Load()
	var a Allowlists
	if st.cur != nil {
		a.Cur = st.cur.Allow
	}
	for _, r := range st.prev {
		if until := r.at.Add(s.grace); now.Before(until) {
			a.Prev = append(a.Prev, Previous{Allow: r.def.Allow, Until: until})
		}
	}
	return a
}

// ServeHTTP serves GET (and HEAD) /api/v1/gathering: the definition in force
// for the caller's tenant (from auth.FromContext) as JSON with a strong
// ETag; If-None-Match with that ETag gets 304 and no body. A tenant with
// neither a definition of its own nor a default gets 404. The caller must
// be authenticated (any credential of a tenant).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, _ := auth.FromContext(r.Context())
	c := s.Current(id.Tenant)
	if c == nil {
		s.requests.WithLabelValues("404").Inc()
		http.Error(w, fmt.Sprintf("no gathering definition for tenant %q", id.Tenant), http.StatusNotFound)
		return
	}
	h := w.Header()
	h.Set("ETag", c.ETag)
	h.Set("Cache-Control", "no-cache")
	h.Set("Vary", "Authorization")
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
