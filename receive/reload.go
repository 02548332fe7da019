package receive

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/phonehome/phonehome/configdiff"
	"github.com/phonehome/phonehome/internal/periodic"
)

// ConfigReloader re-reads the configuration file when it changes (checked
// every interval) or on demand (SIGHUP), and hands a valid new version to
// apply. An invalid version is logged and counted, and the previous one
// stays in force. Only hot-reloadable parts (limits, allowlist, elision)
// should be applied; the rest needs a restart.
type ConfigReloader struct {
	logger   *slog.Logger
	path     string
	apply    func(*Config)
	started  *Config    // the version the process started with
	mu       sync.Mutex // serializes reloads; guards last
	last     [sha256.Size]byte
	reloads  *prometheus.CounterVec
	lastGood prometheus.Gauge
	restart  prometheus.Gauge
}

// hotReloaded are the sections of Config that a reload applies.
var hotReloaded = map[string]bool{"limits": true, "allowlist": true, "elide_labels": true}

// NewConfigReloader watches path, which was loaded once already.
func NewConfigReloader(logger *slog.Logger, reg prometheus.Registerer, path string, apply func(*Config)) *ConfigReloader {
	f := promauto.With(reg)
	started, _ := LoadConfig(path) // the running version, as loaded: the caller may have changed its own
	r := &ConfigReloader{
		logger: logger, path: path, apply: apply, started: started,
		restart: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_receive_config_restart_required",
			Help: "1 when the configuration file differs from the running one in sections a reload does not apply (all but limits, allowlist and elide_labels): a restart is needed for them.",
		}),
		reloads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_receive_config_reloads_total",
			Help: "Configuration reloads by result (success, failure).",
		}, []string{"result"}),
		lastGood: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_receive_config_last_reload_success_timestamp_seconds",
			Help: "When the configuration in force was loaded.",
		}),
	}
	r.reloads.WithLabelValues("success")
	r.reloads.WithLabelValues("failure")
	if b, err := os.ReadFile(path); err == nil {
		r.last = sha256.Sum256(b)
	}
	r.lastGood.SetToCurrentTime()
	return r
}

// Reload loads the file if it changed since the version in force, or
// returns why it kept that version (also logged and counted). Safe for
// concurrent use (SIGHUP, the interval, POST /-/reload); reloads are
// serialized.
func (r *ConfigReloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := os.ReadFile(r.path)
	if err == nil && sha256.Sum256(b) == r.last {
		return nil
	}
	cfg, err := LoadConfig(r.path)
	if err != nil {
		r.reloads.WithLabelValues("failure").Inc()
		r.logger.Error("reload configuration, keeping the previous one", "file", r.path, "err", err)
		return err
	}
	r.apply(cfg)
	WarnUnrenamedAlerts(r.logger, cfg)
	r.last = sha256.Sum256(b)
	r.reloads.WithLabelValues("success").Inc()
	r.lastGood.SetToCurrentTime()
	if pending := restartSections(r.started, cfg); len(pending) > 0 {
		r.restart.Set(1)
		r.logger.Warn("configuration reloaded: limits, allowlist and elide_labels applied; these sections changed and need a restart", "file", r.path, "sections", pending)
		return nil
	}
	r.restart.Set(0)
	r.logger.Info("configuration reloaded", "file", r.path)
	return nil
}

// restartSections names the top-level sections of cfg, by YAML key, that
// differ from running and that a reload does not apply.
func restartSections(running, cfg *Config) []string {
	if running == nil {
		return nil
	}
	return configdiff.Sections(*running, *cfg, hotReloaded)
}

// Run reloads every interval until ctx is done (SIGHUP and POST /-/reload
// call Reload: the receiver's reloadOnSIGHUP, reloadHandler).
func (r *ConfigReloader) Run(ctx context.Context, interval time.Duration) error {
	periodic.Every(ctx, interval, func(context.Context) { _ = r.Reload() }) // logged and counted
	return nil
}
