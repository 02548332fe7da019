// Package query serves the Prometheus HTTP API over the receiver's storage,
// scoped to the tenant of the read credential. It reuses Prometheus' own API
// handlers and PromQL engine, so responses are byte-compatible with
// Prometheus and Grafana's Prometheus data source works unmodified.
package query

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"time"

	"github.com/grafana/regexp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/route"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/scrape"
	v1 "github.com/prometheus/prometheus/web/api/v1"
)

// Options configures the API. Zero values mean the defaults.
type Options struct {
	// LookbackDelta is how far back an instant vector selector looks (5m).
	LookbackDelta time.Duration
	// Timeout bounds one query (DefaultTimeout). NewEngine's times queries
	// out; NewHandler's, the engine's too, is the ceiling of the API's
	// timeout parameter, as Prometheus' --query.timeout.
	Timeout time.Duration
	// MaxSamples bounds the samples one query may load (50M).
	MaxSamples int
	// Ready reports whether queries may be served; nil means always.
	Ready func() bool
	// Version and Revision are reported by /api/v1/status/buildinfo.
	Version, Revision string
	// Rules returns the rules and alerts of the caller's tenant (it reads
	// auth.FromContext) for /rules and /alerts; nil serves none.
	Rules func(context.Context) v1.RulesRetriever
	// Alertmanagers returns where alerts are sent; nil means nowhere.
	Alertmanagers func(context.Context) v1.AlertmanagerRetriever
	// Metadata serves /metadata (LocalMetadata, or the fleet's from
	// peers); nil serves none.
	Metadata MetadataReader
}

// Paths are the API endpoints served, relative to /api/v1. Everything else
// of Prometheus' API (admin, targets, ...) is deliberately absent; remote
// read (/api/v1/read) is NewReadHandler.
var Paths = []string{
	"/query", "/query_range", "/series", "/labels", "/label/{name}/values",
	"/metadata", "/status/buildinfo", "/format_query", "/parse_query",
	"/rules", "/alerts",
}

// NewEngine returns the PromQL engine used by the API (and by rule evaluation).
func NewEngine(logger *slog.Logger, reg prometheus.Registerer, opts Options) *promql.Engine {
	opts.setDefaults()
	return promql.NewEngine(promql.EngineOpts{
		Logger:               logger,
		Reg:                  reg,
		MaxSamples:           opts.MaxSamples,
		Timeout:              opts.Timeout,
		LookbackDelta:        opts.LookbackDelta,
		EnableAtModifier:     true,
		EnableNegativeOffset: true,
		// __name__ is dropped at the end of the query, not by each function:
		// count_over_time({_id="x"}[10m]) over a cluster's many metrics would
		// otherwise fail on duplicate label sets (the status page links such
		// queries). Prometheus 3's promql-delayed-name-removal.
		EnableDelayedNameRemoval: true,
	})
}

// DefaultTimeout bounds one query unless Options.Timeout says otherwise:
// the default of Prometheus' --query.timeout, and of the receiver's.
const DefaultTimeout = 2 * time.Minute

func (o *Options) setDefaults() {
	if o.LookbackDelta == 0 {
		o.LookbackDelta = 5 * time.Minute
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxSamples == 0 {
		o.MaxSamples = 50_000_000
	}
}

// NewHandler returns the /api/v1 handler. It expects auth.Middleware in front.
func NewHandler(logger *slog.Logger, engine promql.QueryEngine, r Reader, opts Options) http.Handler {
	opts.setDefaults()
	ready := func(f http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if opts.Ready != nil && !opts.Ready() {
				http.Error(w, "service unavailable", http.StatusServiceUnavailable)
				return
			}
			f(w, r)
		}
	}
	start := time.Now()
	rulesFor := func(context.Context) v1.RulesRetriever { return noRules{} }
	if opts.Rules != nil {
		rulesFor = opts.Rules
	}
	amsFor := func(context.Context) v1.AlertmanagerRetriever { return noAlertmanagers{} }
	if opts.Alertmanagers != nil {
		amsFor = opts.Alertmanagers
	}
	// One parser for the API and withMatchSets, so that their sets agree.
	promqlParser := parser.NewParser(parser.Options{})
	api := v1.NewAPI(
		engine, tenantQueryable{r}, nil, nil,
		func(context.Context) v1.ScrapePoolsRetriever { return noTargets{} },
		func(context.Context) v1.TargetRetriever { return noTargets{} },
		amsFor,
		func() config.Config { return config.Config{} },
		nil, v1.GlobalURLOptions{}, ready, nil, "",
		false, false, 0, logger,
		rulesFor,
		0, 1, 1<<20, false, noCrossOrigin,
		func() (v1.RuntimeInfo, error) {
			return v1.RuntimeInfo{StartTime: start, GoroutineCount: runtime.NumGoroutine(), GOMAXPROCS: runtime.GOMAXPROCS(0), CWD: cwd()}, nil
		},
		&v1.PrometheusVersion{Version: opts.Version, Revision: opts.Revision, GoVersion: runtime.Version()},
		nil, nil,
		prometheus.NewRegistry(), prometheus.NewRegistry(), // the API's own metrics stay private
		nil, false, nil, false, false, false,
		opts.LookbackDelta, false, false, nil, nil,
		v1.OpenAPIOptions{}, promqlParser, false, opts.Timeout,
	)
	router := route.New()
	api.Register(router.WithPrefix("/api/v1"))
	mux := http.NewServeMux()
	// The label calls ask for all their match[] sets at once (matchsets.go).
	labelCalls := withMatchSets(promqlParser, router)
	for _, p := range Paths {
		switch p = "/api/v1" + p; p {
		case LabelNamesPath, LabelValuesPath:
			mux.Handle(p, labelCalls)
		default:
			mux.Handle(p, router)
		}
	}
	// Ours, not Prometheus' (which reads scrape targets and has no warnings).
	md := opts.Metadata
	if md == nil {
		md = LocalMetadata(noMetadata{})
	}
	mux.Handle("GET /api/v1/metadata", NewMetadataHandler(md, opts.Ready))
	return mux
}

// noCrossOrigin is the API's CORS origin pattern: it matches no origin, so
// no page of another site may read an answer (Grafana's server-side proxy
// mode needs no CORS). Prometheus' API code dereferences the pattern for
// every request with an Origin header: nil made each of them a panic, and
// the client saw its connection dropped.
var noCrossOrigin = regexp.MustCompile(`a^`)

func cwd() string {
	d, _ := os.Getwd()
	return d
}

// noTargets: the receiver scrapes nothing, so target endpoints are empty
// (and Prometheus' /metadata, which reads targets, would be too).
type noTargets struct{}

func (noTargets) ScrapePools() []string                                 { return nil }
func (noTargets) TargetsActive() map[string][]*scrape.Target            { return nil }
func (noTargets) TargetsDropped() map[string][]*scrape.Target           { return nil }
func (noTargets) TargetsDroppedCounts() map[string]int                  { return nil }
func (noTargets) ScrapePoolConfig(string) (*config.ScrapeConfig, error) { return nil, nil }

type noMetadata struct{}

func (noMetadata) Metadata(string, string, int) (map[string][]metadata.Metadata, error) {
	return map[string][]metadata.Metadata{}, nil
}

type noAlertmanagers struct{}

func (noAlertmanagers) Alertmanagers() []*url.URL        { return nil }
func (noAlertmanagers) DroppedAlertmanagers() []*url.URL { return nil }

type noRules struct{}

func (noRules) RuleGroups() []*rules.Group           { return nil }
func (noRules) AlertingRules() []*rules.AlertingRule { return nil }
