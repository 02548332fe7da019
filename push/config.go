package push

import (
	"errors"
	"fmt"
	"time"

	"github.com/alecthomas/units"
	"github.com/prometheus/common/model"
)

// Config is the `push:` section of the receiver configuration. Zero values
// mean the defaults (see SetDefaults and README.md).
type Config struct {
	// AllowedMetrics lists the metric family names that may be pushed. A
	// histogram is named by its family name (without _bucket/_sum/_count).
	// Default: the installer's metrics (DefaultAllowedMetrics).
	AllowedMetrics []string `yaml:"allowed_metrics"`
	// GaugePolicy is how gauges of equal label sets combine: "sum" (the
	// default, like prom-aggregation-gateway) or "last" (the latest push wins).
	GaugePolicy string `yaml:"gauge_policy"`
	// FlushInterval is the resolution at which the aggregated values are
	// written into the tenant's TSDB and the durable log is compacted into a
	// snapshot. Default 30s.
	FlushInterval model.Duration `yaml:"flush_interval"`
	// MaxBodyBytes caps a push body. Default 1MiB.
	MaxBodyBytes units.Base2Bytes `yaml:"max_body_bytes"`
	// MaxSeriesPerTenant caps the aggregated series (histogram buckets count
	// one each) one tenant may hold. Default 10000. When a push would exceed
	// it, series already written into the TSDB are evicted to make room:
	// first those pushed only once, then those no push has touched for
	// EvictIdleAfter, least recently pushed first (README "Series budget").
	MaxSeriesPerTenant int `yaml:"max_series_per_tenant"`
	// EvictIdleAfter is how long a series pushed more than once must go
	// untouched before the series budget may evict it. Default 1d.
	EvictIdleAfter model.Duration `yaml:"evict_idle_after"`
	// MaxSeriesPerPush caps the samples of one push. Default 1000.
	MaxSeriesPerPush int `yaml:"max_series_per_push"`
	// MaxLabelsPerSeries, MaxLabelNameLength and MaxLabelValueLength bound
	// every series (grouping labels included). Defaults 32, 128, 256.
	MaxLabelsPerSeries  int `yaml:"max_labels_per_series"`
	MaxLabelNameLength  int `yaml:"max_label_name_length"`
	MaxLabelValueLength int `yaml:"max_label_value_length"`
	// RateLimit bounds pushes per credential (per bearer token).
	RateLimit RateLimit `yaml:"rate_limit"`
	// SeriesTTL drops an aggregated series from the state (and stops
	// writing it) once no push has added to it for this long. Default 30d.
	SeriesTTL model.Duration `yaml:"series_ttl"`
}

// RateLimit is a token bucket: RequestsPerSecond refill, Burst capacity.
type RateLimit struct {
	RequestsPerSecond float64 `yaml:"requests_per_second"` // default 50
	Burst             int     `yaml:"burst"`               // default 100
}

// Gauge policies.
const (
	GaugeSum  = "sum"
	GaugeLast = "last"
)

// DefaultAllowedMetrics are the installer's metrics (see push/client).
var DefaultAllowedMetrics = []string{
	"cluster_installation_invocation",
	"cluster_installation_duration",
	"cluster_installation_modification",
	"cluster_installation_duration_seconds",
}

// Defaults.
const (
	defaultFlushInterval       = 30 * time.Second
	defaultMaxBodyBytes        = 1 << 20
	defaultMaxSeriesPerTenant  = 10000
	defaultMaxSeriesPerPush    = 1000
	defaultMaxLabelsPerSeries  = 32
	defaultMaxLabelNameLength  = 128
	defaultMaxLabelValueLength = 256
	defaultRequestsPerSecond   = 50
	defaultBurst               = 100
	defaultSeriesTTL           = 30 * 24 * time.Hour
	defaultEvictIdleAfter      = 24 * time.Hour
)

// SetDefaults fills every unset field.
func (c *Config) SetDefaults() {
	if c.AllowedMetrics == nil {
		c.AllowedMetrics = append([]string(nil), DefaultAllowedMetrics...)
	}
	if c.GaugePolicy == "" {
		c.GaugePolicy = GaugeSum
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = model.Duration(defaultFlushInterval)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = defaultMaxBodyBytes
	}
	if c.MaxSeriesPerTenant == 0 {
		c.MaxSeriesPerTenant = defaultMaxSeriesPerTenant
	}
	if c.MaxSeriesPerPush == 0 {
		c.MaxSeriesPerPush = defaultMaxSeriesPerPush
	}
	if c.MaxLabelsPerSeries == 0 {
		c.MaxLabelsPerSeries = defaultMaxLabelsPerSeries
	}
	if c.MaxLabelNameLength == 0 {
		c.MaxLabelNameLength = defaultMaxLabelNameLength
	}
	if c.MaxLabelValueLength == 0 {
		c.MaxLabelValueLength = defaultMaxLabelValueLength
	}
	if c.RateLimit.RequestsPerSecond == 0 {
		c.RateLimit.RequestsPerSecond = defaultRequestsPerSecond
	}
	if c.RateLimit.Burst == 0 {
		c.RateLimit.Burst = defaultBurst
	}
	if c.SeriesTTL == 0 {
		c.SeriesTTL = model.Duration(defaultSeriesTTL)
	}
	if c.EvictIdleAfter == 0 {
		c.EvictIdleAfter = model.Duration(defaultEvictIdleAfter)
	}
}

// Validate reports every problem with its YAML path.
func (c *Config) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for i, n := range c.AllowedMetrics {
		switch {
		case !model.LegacyValidation.IsValidMetricName(n):
			errs = append(errs, fmt.Errorf("push.allowed_metrics[%d] %q: not a valid metric name", i, n))
		case seen[n]:
			errs = append(errs, fmt.Errorf("push.allowed_metrics[%d] %q: duplicate", i, n))
		}
		seen[n] = true
	}
	if c.GaugePolicy != GaugeSum && c.GaugePolicy != GaugeLast {
		errs = append(errs, fmt.Errorf("push.gauge_policy: %q, want sum or last", c.GaugePolicy))
	}
	if c.FlushInterval < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("push.flush_interval: %s is shorter than 1s", c.FlushInterval))
	}
	if c.SeriesTTL < c.FlushInterval {
		errs = append(errs, fmt.Errorf("push.series_ttl: %s is shorter than push.flush_interval (%s)", c.SeriesTTL, c.FlushInterval))
	}
	if c.EvictIdleAfter < c.FlushInterval {
		errs = append(errs, fmt.Errorf("push.evict_idle_after: %s is shorter than push.flush_interval (%s)", c.EvictIdleAfter, c.FlushInterval))
	}
	positive := func(path string, v int64) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("push.%s: must be positive, got %d", path, v))
		}
	}
	positive("max_body_bytes", int64(c.MaxBodyBytes))
	positive("max_series_per_tenant", int64(c.MaxSeriesPerTenant))
	positive("max_series_per_push", int64(c.MaxSeriesPerPush))
	positive("max_labels_per_series", int64(c.MaxLabelsPerSeries))
	positive("max_label_name_length", int64(c.MaxLabelNameLength))
	positive("max_label_value_length", int64(c.MaxLabelValueLength))
	positive("rate_limit.burst", int64(c.RateLimit.Burst))
	if c.RateLimit.RequestsPerSecond <= 0 {
		errs = append(errs, fmt.Errorf("push.rate_limit.requests_per_second: must be positive, got %g", c.RateLimit.RequestsPerSecond))
	}
	return errors.Join(errs...)
}
