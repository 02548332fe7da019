// Package rules evaluates the fleet's Prometheus rule files for every tenant
// over the receiver's storage and sends the resulting alerts to Alertmanager.
//
// It is a thin layer over Prometheus' own rules and notifier packages. Each
// tenant gets its own rules.Manager whose Queryable and Appendable are bound
// to that tenant: the Prometheus Manager has exactly one Queryable, one
// Appendable and one set of groups, so one Manager per tenant is the only way
// to keep tenants apart without rewriting every query. All tenants evaluate
// the same rule files; a tenant is picked up once it has data.
//
// Rule files are re-read every reload interval, and whenever Reload is
// called (the receiver's SIGHUP and POST /-/reload). A file set that does not
// parse is logged (once per broken state), counted in
// phonehome_rules_reloads_total{result="failure"} at every failed reload,
// and the previous rules stay in force (the last good contents are kept in
// memory, so tenants discovered later get them too).
//
// A rule whose query reads partial data (a peer unavailable, a bucket block
// not fetched) skips that evaluation instead of recording or alerting on
// the rest (partial.go).
package rules

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	commoncfg "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	promconfig "github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery/targetgroup"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/notifier"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	promrules "github.com/prometheus/prometheus/rules"
	promstorage "github.com/prometheus/prometheus/storage"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/storage"
)

// TenantLabel is added to every alert sent to Alertmanager (and is the
// "tenant" external label in templates).
const TenantLabel = "tenant"

// Storage is what rule evaluation needs from the receiver's storage: reads
// and writes per tenant, and the tenants that exist. *storage.DB satisfies it.
type Storage interface {
	storage.Writer
	Reader
	Tenants() []string
}

// Reader opens queriers over one tenant's data (query.Reader).
type Reader interface {
	Querier(tenant string, mint, maxt int64) (promstorage.Querier, error)
}

// Options are the optional dependencies of a Manager.
type Options struct {
	// Reader, when set, is what rules query instead of the Storage: with
	// replicas, the fleet-wide view (peers and bucket), so that the one
	// evaluating replica computes fleet answers.
	Reader Reader
	// Tenants, when set, are further sources of tenants to evaluate besides
	// the Storage's (tenants whose data is in the bucket or only in a
	// peer's head).
	Tenants []func() []string
}

// Manager runs the rule evaluation of every tenant. Create it with New, run
// it with Run; RulesRetriever and AlertmanagerRetriever are safe for
// concurrent use at any time (they serve nothing before Run).
type Manager struct {
	logger   *slog.Logger
	cfg      Config
	engine   promql.QueryEngine
	store    Storage
	reader   Reader
	sources  []func() []string
	parser   parser.Parser
	notifier *notifier.Manager // nil without Alertmanagers
	metrics  *metrics
	groupMet *promrules.Metrics

	snap     atomic.Pointer[snapshot] // last good rule files
	reloadMu sync.Mutex               // serializes Reload (Run's interval, SIGHUP, POST /-/reload); guards lastErr
	lastErr  string                   // last reload error reported

	// resendDelay is how often a firing alert is sent again (Prometheus'
	// --rules.alert.resend-delay); a field so that tests can shorten it.
	resendDelay time.Duration
	// restoreRetryWait is the wait before reading the `for` state again
	// after a partial answer (restore.go); a field so that tests can
	// shorten it.
	restoreRetryWait time.Duration

	mu      sync.Mutex
	tenants map[string]*tenantRules
	wg      sync.WaitGroup
}

// tenantRules is one tenant's Prometheus rules manager and what its groups
// run at each evaluation (the group's evaluation, then alerts resent for
// rules that skipped it: partial.go).
type tenantRules struct {
	*promrules.Manager
	iterate promrules.GroupEvalIterationFunc
	notify  promrules.NotifyFunc
}

// snapshot is a parsed-and-valid set of rule files, by file name.
type snapshot struct {
	names []string
	files map[string][]byte
}

type metrics struct {
	reloads     *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	tenants     prometheus.Gauge
	partial     prometheus.Counter
	// partialRestores counts reads of the `for` state that got partial
	// data: read again (retried) or not restored (failed).
	partialRestores *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		reloads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_rules_reloads_total",
			Help: "Rule file reloads by result: success (one that changed something), failure (every failed one: the previous rules stay in force).",
		}, []string{"result"}),
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_rules_last_reload_successful",
			Help: "1 if the last attempt to load the rule files succeeded.",
		}),
		tenants: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_rules_tenants",
			Help: "Tenants whose rules are being evaluated.",
		}),
		partial: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_rules_partial_evaluations_total",
			Help: "Rule queries that read partial data (a peer unavailable, a bucket block not fetched), so the rule skipped that evaluation.",
		}),
		partialRestores: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_rules_partial_restores_total",
			Help: "Reads of an alerting rule's `for` state (ALERTS_FOR_STATE) at start that got partial data, by result: retried (read again), failed (still partial: not restored, its alerts wait their full `for`).",
		}, []string{"result"}),
	}
	// A replica without rule files, or one that does not evaluate them,
	// loads nothing and has nothing failing: 1, as Prometheus' config
	// reload gauge, so that an alert on it does not fire there.
	m.lastSuccess.Set(1)
	m.partialRestores.WithLabelValues("retried")
	m.partialRestores.WithLabelValues("failed")
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	return m
}

// New loads the rule files named by cfg and prepares the notifier. An invalid
// rule file at start is an error (the receiver refuses to start, like a bad
// config). engine is shared with the query API.
func New(logger *slog.Logger, reg prometheus.Registerer, engine promql.QueryEngine, store Storage, cfg Config, opts Options) (*Manager, error) {
	m := &Manager{
		logger:  logger,
		cfg:     cfg,
		engine:  engine,
		store:   store,
		reader:  opts.Reader,
		sources: append([]func() []string{store.Tenants}, opts.Tenants...),
		parser:  parser.NewParser(parser.Options{}),
		metrics: newMetrics(reg),
		tenants: map[string]*tenantRules{},

		resendDelay:      time.Minute,
		restoreRetryWait: 5 * time.Second,
	}
	if m.reader == nil {
		m.reader = store
	}
	if cfg.enabled() {
		// Only where rule files are configured: the max over the replicas
		// is 0 when none evaluates (PhonehomeFleetRulesNotEvaluated), e.g.
		// an evaluator_replica that names no replica.
		evaluating := promauto.With(reg).NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_rules_evaluating",
			Help: "1 if this replica evaluates the fleet rules, 0 if its rule files are left to another replica (rules.evaluate, rules.evaluator_replica). Absent without rule files.",
		})
		if cfg.Evaluates() {
			evaluating.Set(1)
		}
	}
	if !cfg.Evaluates() {
		if cfg.enabled() {
			logger.Info("this replica does not evaluate the fleet rules (rules.evaluate false, or rules.evaluator_replica names another replica)", "evaluator_replica", cfg.EvaluatorReplica, "replica", cfg.replica)
		}
		return m, nil
	}
	m.groupMet = promrules.NewGroupMetrics(reg)
	snap, err := m.readFiles()
	if err != nil {
		return nil, err
	}
	m.snap.Store(snap)
	m.metrics.lastSuccess.Set(1)
	if len(cfg.Alertmanagers) > 0 {
		n, err := newNotifier(logger, reg, cfg.Alertmanagers)
		if err != nil {
			return nil, err
		}
		m.notifier = n
	}
	return m, nil
}

// CheckFiles loads and validates the rule files of cfg without running
// anything (for --check-config).
func CheckFiles(cfg Config) error {
	m := &Manager{cfg: cfg, parser: parser.NewParser(parser.Options{}), logger: slog.New(slog.DiscardHandler)}
	_, err := m.readFiles()
	return err
}

// readFiles expands the globs, reads and validates every file.
func (m *Manager) readFiles() (*snapshot, error) {
	s := &snapshot{files: map[string][]byte{}}
	var errs []error
	for _, pat := range m.cfg.Files {
		matches, err := filepath.Glob(pat)
		if err != nil {
			errs = append(errs, fmt.Errorf("rules.files %q: %w", pat, err))
			continue
		}
		for _, f := range matches {
			if _, dup := s.files[f]; dup {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				errs = append(errs, fmt.Errorf("read rule file: %w", err))
				continue
			}
			if _, perrs := rulefmt.Parse(b, false, model.UTF8Validation, m.parser, m.logger); len(perrs) > 0 {
				for _, e := range perrs {
					errs = append(errs, fmt.Errorf("rule file %s: %w", f, e))
				}
				continue
			}
			s.files[f] = b
			s.names = append(s.names, f)
		}
	}
	sort.Strings(s.names)
	return s, errors.Join(errs...)
}

func (s *snapshot) equal(o *snapshot) bool {
	if len(s.files) != len(o.files) {
		return false
	}
	for k, v := range s.files {
		if w, ok := o.files[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// Run evaluates rules until ctx is done, re-reading the rule files and
// picking up new tenants every reload interval. It returns nil once every
// evaluation has stopped and pending alerts have been handed to the notifier.
func (m *Manager) Run(ctx context.Context) error {
	if !m.cfg.Evaluates() {
		<-ctx.Done()
		return nil
	}
	notifierDone := make(chan struct{})
	if m.notifier != nil {
		tsets := make(chan map[string][]*targetgroup.Group, 1)
		tsets <- alertmanagerTargets(m.cfg.Alertmanagers)
		go func() {
			defer close(notifierDone)
			m.notifier.Run(tsets)
		}()
	} else {
		close(notifierDone)
	}

	tick := time.NewTicker(time.Duration(m.cfg.ReloadInterval))
	defer tick.Stop()
	for {
		m.syncTenants(ctx)
		select {
		case <-ctx.Done():
			m.sendBeforeStop(context.WithoutCancel(ctx)) // first: its batch is sent while the groups stop
			m.stopAll()
			if m.notifier != nil {
				m.notifier.Stop()
			}
			<-notifierDone
			return nil
		case <-tick.C:
			_ = m.Reload() // logged and counted inside; the previous rules stay
		}
	}
}

// Reload re-reads the rule files. If they changed and are valid, every tenant
// switches to them before it returns; if any is invalid, the error is
// logged and counted and the previous rules stay in force. It returns the
// load error, if any. Safe for concurrent use; reloads are serialized.
func (m *Manager) Reload() error {
	if !m.cfg.Evaluates() {
		return nil
	}
	m.reloadMu.Lock()
	defer m.reloadMu.Unlock()
	snap, err := m.readFiles()
	if err != nil {
		m.metrics.lastSuccess.Set(0)
		// Every failed reload counts, as the other files' reloads do; each
		// broken state is logged once, not every interval.
		m.metrics.reloads.WithLabelValues("failure").Inc()
		if msg := err.Error(); msg != m.lastErr {
			m.lastErr = msg
			m.logger.Error("invalid rule files, keeping the previous rules", "err", err)
		}
		return err
	}
	m.lastErr = ""
	m.metrics.lastSuccess.Set(1)
	if m.snap.Load().equal(snap) {
		return nil
	}
	m.snap.Store(snap)
	m.metrics.reloads.WithLabelValues("success").Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	for tenant, tr := range m.tenants {
		if err := m.update(tenant, tr); err != nil {
			m.logger.Error("apply rule files", "tenant", tenant, "err", err)
		}
	}
	m.logger.Info("rule files reloaded", "files", len(snap.names))
	return nil
}

func (m *Manager) update(tenant string, tr *tenantRules) error {
	return tr.Update(time.Duration(m.cfg.EvaluationInterval), m.snap.Load().names,
		labels.FromStrings(TenantLabel, tenant), m.cfg.ExternalURL, tr.iterate)
}

// syncTenants starts evaluation for tenants that have appeared.
func (m *Manager) syncTenants(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, tenant := range m.allTenants() {
		if _, ok := m.tenants[tenant]; ok {
			continue
		}
		tr := m.newTenantRules(ctx, tenant)
		if err := m.update(tenant, tr); err != nil {
			m.logger.Error("load rules", "tenant", tenant, "err", err)
		}
		m.tenants[tenant] = tr
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			tr.Run()
		}()
		m.logger.Info("evaluating rules", "tenant", tenant)
	}
	m.metrics.tenants.Set(float64(len(m.tenants)))
}

// allTenants is the union of every tenant source.
func (m *Manager) allTenants() []string {
	var all []string
	for _, f := range m.sources {
		all = append(all, f()...)
	}
	slices.Sort(all)
	return slices.Compact(all)
}

func (m *Manager) newTenantRules(ctx context.Context, tenant string) *tenantRules {
	queryable := promstorage.QueryableFunc(func(mint, maxt int64) (promstorage.Querier, error) {
		return m.reader.Querier(tenant, mint, maxt)
	})
	notify := func(context.Context, string, ...*promrules.Alert) {}
	if m.notifier != nil {
		notify = promrules.SendAlerts(tenantSender{n: m.notifier, tenant: tenant}, trimSlash(m.cfg.ExternalURL))
	}
	// Queries in the group context carry the tenant too, for any
	// tenant-scoped Queryable a QueryFunc might reach.
	active := &activeRules{}
	restore := restoreQueryable{q: queryable, stop: ctx, retryWait: m.restoreRetryWait, partial: m.metrics.partialRestores, holdAlerts: active.holdAlerts}
	ctx = auth.WithIdentity(context.WithoutCancel(ctx), auth.Identity{Tenant: tenant})
	mgr := promrules.NewManager(&promrules.ManagerOptions{
		ExternalURL:     m.externalURL(),
		QueryFunc:       m.queryFunc(queryable),
		NotifyFunc:      notify,
		Context:         ctx,
		AppendableV2:    tenantAppendable{w: m.store, tenant: tenant},
		Queryable:       restore, // the `for` state restore only
		Logger:          m.logger.With("tenant", tenant),
		OutageTolerance: time.Hour,
		ForGracePeriod:  10 * time.Minute,
		ResendDelay:     m.resendDelay,
		GroupLoader:     loader{snap: &m.snap, parser: m.parser, logger: m.logger},
		Metrics:         m.groupMet, // shared: one registration, groups of all tenants
		Parser:          m.parser,
	})
	return &tenantRules{Manager: mgr, iterate: active.track(resendSkipped(notify, m.resendDelay)), notify: notify}
}

func (m *Manager) externalURL() *url.URL {
	u, err := url.Parse(m.cfg.ExternalURL) // validated
	if err != nil || m.cfg.ExternalURL == "" {
		return &url.URL{}
	}
	return u
}

func (m *Manager) stopAll() {
	m.mu.Lock()
	for _, tr := range m.tenants {
		tr.Stop()
	}
	m.mu.Unlock()
	m.wg.Wait()
}

// tenant returns the tenant's rules manager, or nil.
func (m *Manager) tenant(name string) *promrules.Manager {
	m.mu.Lock()
	defer m.mu.Unlock()
	if tr := m.tenants[name]; tr != nil {
		return tr.Manager
	}
	return nil
}

// RulesRetriever serves /api/v1/rules and /api/v1/alerts for the tenant in
// ctx (auth.FromContext). Other tenants' rules are never visible.
func (m *Manager) RulesRetriever(ctx context.Context) v1.RulesRetriever {
	if id, ok := auth.FromContext(ctx); ok {
		if mgr := m.tenant(id.Tenant); mgr != nil {
			return mgr
		}
	}
	return noRules{}
}

// AlertmanagerRetriever serves /api/v1/alertmanagers.
func (m *Manager) AlertmanagerRetriever(context.Context) v1.AlertmanagerRetriever {
	if m.notifier == nil {
		return noAlertmanagers{}
	}
	return m.notifier
}

type noRules struct{}

func (noRules) RuleGroups() []*promrules.Group           { return nil }
func (noRules) AlertingRules() []*promrules.AlertingRule { return nil }

type noAlertmanagers struct{}

func (noAlertmanagers) Alertmanagers() []*url.URL        { return nil }
func (noAlertmanagers) DroppedAlertmanagers() []*url.URL { return nil }

// tenantSender adds the tenant label to every alert.
type tenantSender struct {
	n      *notifier.Manager
	tenant string
}

func (s tenantSender) Send(alerts ...*notifier.Alert) {
	for _, a := range alerts {
		b := labels.NewBuilder(a.Labels)
		b.Set(TenantLabel, s.tenant)
		a.Labels = b.Labels()
	}
	s.n.Send(alerts...)
}

// loader serves rule files from the last good snapshot, so a file broken on
// disk after it was loaded never reaches a tenant.
type loader struct {
	snap   *atomic.Pointer[snapshot]
	parser parser.Parser
	logger *slog.Logger
}

func (l loader) Load(name string, ignoreUnknownFields bool, scheme model.ValidationScheme) (*rulefmt.RuleGroups, []error) {
	b, ok := l.snap.Load().files[name]
	if !ok {
		return nil, []error{fmt.Errorf("rule file %s: not loaded", name)}
	}
	return rulefmt.Parse(b, ignoreUnknownFields, scheme, l.parser, l.logger)
}

func (l loader) Parse(q string) (parser.Expr, error) { return l.parser.ParseExpr(q) }

// newNotifier builds Prometheus' notifier for static Alertmanager URLs.
func newNotifier(logger *slog.Logger, reg prometheus.Registerer, ams []AlertmanagerConfig) (*notifier.Manager, error) {
	n := notifier.NewManager(&notifier.Options{
		QueueCapacity:   10000,
		DrainOnShutdown: true,
		Registerer:      reg,
	}, model.UTF8Validation, logger.With("component", "notifier"))
	cfg := promconfig.Config{}
	for i, am := range ams {
		u, err := url.Parse(am.URL)
		if err != nil {
			return nil, fmt.Errorf("rules.alertmanagers[%d].url: %w", i, err)
		}
		c := promconfig.DefaultAlertmanagerConfig
		c.Scheme = u.Scheme
		c.PathPrefix = trimSlash(u.Path)
		c.Timeout = am.Timeout
		c.HTTPClientConfig = commoncfg.DefaultHTTPClientConfig
		if am.BearerTokenFile != "" {
			c.HTTPClientConfig.Authorization = &commoncfg.Authorization{Type: "Bearer", CredentialsFile: am.BearerTokenFile}
		}
		if err := c.HTTPClientConfig.Validate(); err != nil {
			return nil, fmt.Errorf("rules.alertmanagers[%d]: %w", i, err)
		}
		cfg.AlertingConfig.AlertmanagerConfigs = append(cfg.AlertingConfig.AlertmanagerConfigs, &c)
	}
	if err := n.ApplyConfig(&cfg); err != nil {
		return nil, fmt.Errorf("rules.alertmanagers: %w", err)
	}
	return n, nil
}

// alertmanagerTargets is the static "discovery" of the configured URLs, keyed
// as promconfig.AlertmanagerConfigs.ToMap keys them.
func alertmanagerTargets(ams []AlertmanagerConfig) map[string][]*targetgroup.Group {
	out := map[string][]*targetgroup.Group{}
	for i, am := range ams {
		u, _ := url.Parse(am.URL) // validated
		out[fmt.Sprintf("config-%d", i)] = []*targetgroup.Group{{
			Source:  fmt.Sprintf("rules.alertmanagers[%d]", i),
			Targets: []model.LabelSet{{model.AddressLabel: model.LabelValue(u.Host)}},
		}}
	}
	return out
}
