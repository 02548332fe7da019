package receive

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
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
	last     [sha256.Size]byte
	reloads  *prometheus.CounterVec
	lastGood prometheus.Gauge
}

// NewConfigReloader watches path, which was loaded once already.
func NewConfigReloader(logger *slog.Logger, reg prometheus.Registerer, path string, apply func(*Config)) *ConfigReloader {
	f := promauto.With(reg)
	r := &ConfigReloader{
		logger: logger, path: path, apply: apply,
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

// Reload loads the file if it changed since the version in force.
func (r *ConfigReloader) Reload() {
	b, err := os.ReadFile(r.path)
	if err == nil && sha256.Sum256(b) == r.last {
		return
	}
	cfg, err := LoadConfig(r.path)
	if err != nil {
		r.reloads.WithLabelValues("failure").Inc()
		r.logger.Error("reload configuration, keeping the previous one", "file", r.path, "err", err)
		return
	}
	r.apply(cfg)
	r.last = sha256.Sum256(b)
	r.reloads.WithLabelValues("success").Inc()
	r.lastGood.SetToCurrentTime()
	r.logger.Info("configuration reloaded", "file", r.path)
}

// Run reloads every interval and whenever hup delivers, until ctx is done.
func (r *ConfigReloader) Run(ctx context.Context, interval time.Duration, hup <-chan os.Signal) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			r.Reload()
		case <-hup:
			r.Reload()
		}
	}
}
