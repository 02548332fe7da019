// Package status is the receiver's fleet status page and the JSON API
// behind it (GET /api/v1/status/...): which clusters report, what each one
// costs, and what was refused and why, per tenant.
//
// Its data comes from state the receiver already keeps: the limiter's
// per-cluster tracking (limits.Limiter.TrackClusters), the TSDB (one
// cluster's series and its chart, through PromQL), and the receiver's own
// registry (WAL, head, bucket lag). A minute-by-minute history of each
// tenant's totals, kept for a day (in Options.HistoryFile across restarts),
// draws the fleet charts.
//
// The page (GET /) is static HTML and JavaScript embedded in the binary; it
// holds no data and asks the API with the read token the user enters, kept
// in the browser's session storage and sent as a bearer header, never in a
// URL or a cookie.
package status

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/promql"
	promstorage "github.com/prometheus/prometheus/storage"

	"github.com/phonehome/phonehome/limits"
)

// Reader opens queriers over one tenant's data (storage.DB, or the bucket
// store's reader over it).
type Reader interface {
	Querier(tenant string, mint, maxt int64) (promstorage.Querier, error)
}

// Options configures the status page. Limiter is required and must track
// clusters (limits.Limiter.TrackClusters); the rest may be nil.
type Options struct {
	Limiter *limits.Limiter
	// Reader serves one cluster's series and, through the status page's
	// own PromQL engine, its chart.
	Reader Reader
	// Engine runs the charts' PromQL: the query API's (query.NewEngine),
	// whose delayed __name__ removal lets count_over_time over a cluster's
	// series of many names keep them apart, so the page's PromQL links give
	// the same answer in Grafana. Nil: an engine of the same settings.
	Engine *promql.Engine
	// Gatherer is the receiver's registry: WAL, head and bucket figures.
	Gatherer prometheus.Gatherer
	// Definition returns the version of the gathering definition in force
	// for a tenant ("" for none).
	Definition func(tenant string) string
	// Tenants lists the tenants with storage, for fleet_status credentials.
	Tenants func() []string
	// Interval is the forwarders' collection interval (4m30s). A cluster
	// seen within two intervals reports now; one not seen for
	// SilentIntervals (3) has gone silent.
	Interval        time.Duration
	SilentIntervals int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// HistoryFile, when set, keeps the charts' history across restarts: read
	// at New, written every 10 minutes and when Run ends.
	HistoryFile string
}

// Patterns are the API's routes, for a mux in front of Handler: each
// named, so /api/v1/status/buildinfo stays the Prometheus API's.
var Patterns = []string{
	"GET /api/v1/status/tenants",
	"GET /api/v1/status/overview",
	"GET /api/v1/status/history",
	"GET /api/v1/status/clusters",
	"GET /api/v1/status/clusters/{id}",
}

// Status serves the page and the API. Safe for concurrent use.
type Status struct {
	logger *slog.Logger
	opts   Options
	mux    *http.ServeMux

	run     int64 // this process's points (its start, Unix nanoseconds)
	mu      sync.Mutex
	history map[string]*history // by tenant

	requests *prometheus.CounterVec
}

// New returns the status page over opts. reg may be nil.
func New(logger *slog.Logger, reg prometheus.Registerer, opts Options) *Status {
	if opts.Interval <= 0 {
		opts.Interval = 270 * time.Second
	}
	if opts.SilentIntervals <= 0 {
		opts.SilentIntervals = 3
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Status{
		logger: logger, opts: opts, history: map[string]*history{}, run: time.Now().UnixNano(),
		requests: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_status_requests_total",
			Help: "Status API requests by endpoint and HTTP status code.",
		}, []string{"endpoint", "code"}),
	}
	if s.opts.Engine == nil {
		s.opts.Engine = promql.NewEngine(promql.EngineOpts{
			Logger: logger, MaxSamples: 5_000_000, Timeout: 20 * time.Second, LookbackDelta: 5 * time.Minute,
			EnableDelayedNameRemoval: true,
		})
	}
	if err := s.load(); err != nil { // the charts start empty; never a reason not to start
		logger.Warn("status page history not loaded, the charts start empty", "err", err)
	}
	s.mux = http.NewServeMux()
	s.route("GET /api/v1/status/tenants", "tenants", s.tenants)
	s.route("GET /api/v1/status/overview", "overview", s.overview)
	s.route("GET /api/v1/status/history", "history", s.historyAPI)
	s.route("GET /api/v1/status/clusters", "clusters", s.clusters)
	s.route("GET /api/v1/status/clusters/{id}", "cluster", s.cluster)
	return s
}

// Handler serves the API. It expects auth.Middleware in front of it (with
// no required permission: it checks read or admin itself).
func (s *Status) Handler() http.Handler { return s.mux }

// Run records each tenant's totals every minute until ctx is done, and
// writes them to the history file every 10 minutes and at the end.
func (s *Status) Run(ctx context.Context) error {
	s.Record()
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	lastSave := s.opts.Now()
	for {
		select {
		case <-ctx.Done():
			s.Record()
			s.saveLogged()
			return nil
		case <-t.C:
			lastSave = s.tick(lastSave)
		}
	}
}

// tick records a point, and writes the history if saveInterval has passed
// since lastSave; it returns when the history was last written.
func (s *Status) tick(lastSave time.Time) time.Time {
	s.Record()
	now := s.opts.Now()
	if now.Sub(lastSave) < saveInterval {
		return lastSave
	}
	s.saveLogged()
	return now
}

func (s *Status) saveLogged() {
	if err := s.save(); err != nil {
		s.logger.Warn("status page history not saved", "file", s.opts.HistoryFile, "err", err)
	}
}

// reportingWindow and silentAfter are the cluster states' thresholds.
func (s *Status) reportingWindow() time.Duration { return 2 * s.opts.Interval }
func (s *Status) silentAfter() time.Duration {
	return time.Duration(s.opts.SilentIntervals) * s.opts.Interval
}

// finite maps NaN and ±Inf (JSON cannot carry them) to 0.
func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}
