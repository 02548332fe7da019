package limits

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/alecthomas/units"
	"github.com/prometheus/common/model"

	"github.com/phonehome/phonehome/internal/strictyaml"
)

// Config is the `limits:` section of the receiver configuration.
//
//	limits:
//	  defaults:              # every tenant without an override
//	    max_series_per_cluster: 10000
//	  tenants:
//	    acme:                # only the keys written here differ from defaults
//	      max_series_per_cluster: 50000
//	      samples_per_second_per_cluster: 0   # 0 = unlimited
//
// Inheritance uses pointer fields: a key that is absent from a tenant's
// override (a nil field in its Spec) takes the value from defaults, and a key
// absent from defaults takes the built-in default (see DefaultTenantLimits).
// An explicit 0 is therefore distinguishable from "unset", which is what
// lets an override say "unlimited" where 0 means unlimited.
//
// Decode it strictly (internal/strictyaml, as receive.LoadConfig does), then call
// SetDefaults and Validate. A Config that validates never makes the Limiter
// fail later.
type Config struct {
	Defaults Spec            `yaml:"defaults,omitempty"`
	Tenants  map[string]Spec `yaml:"tenants,omitempty"`
}

// Spec is one set of limits as written in YAML. A nil field is unset: in
// Config.Defaults it takes the built-in default, in a tenant override it
// inherits Config.Defaults. See TenantLimits for the meaning of each key.
type Spec struct {
	MaxSeriesPerCluster           *int              `yaml:"max_series_per_cluster,omitempty"`
	MaxSeriesPerTenant            *int              `yaml:"max_series_per_tenant,omitempty"`
	MaxSeriesPerMetric            *int              `yaml:"max_series_per_metric,omitempty"`
	MaxLabelNamesPerSeries        *int              `yaml:"max_label_names_per_series,omitempty"`
	MaxLabelNameLength            *int              `yaml:"max_label_name_length,omitempty"`
	MaxLabelValueLength           *int              `yaml:"max_label_value_length,omitempty"`
	SamplesPerSecondPerCluster    *float64          `yaml:"samples_per_second_per_cluster,omitempty"`
	BurstPerCluster               *int              `yaml:"burst_per_cluster,omitempty"`
	SamplesPerSecondPerTenant     *float64          `yaml:"samples_per_second_per_tenant,omitempty"`
	BurstPerTenant                *int              `yaml:"burst_per_tenant,omitempty"`
	SeriesIdleTimeout             *model.Duration   `yaml:"series_idle_timeout,omitempty"`
	MaxBodyBytes                  *units.Base2Bytes `yaml:"max_body_bytes,omitempty"`
	MaxDecodedBytes               *units.Base2Bytes `yaml:"max_decoded_bytes,omitempty"`
	MaxInflightRequestsPerCluster *int              `yaml:"max_inflight_requests_per_cluster,omitempty"`
}

// TenantLimits are the effective limits of one tenant, with every inheritance
// resolved. Limiter.For returns them; the receiver reads MaxBodyBytes and
// MaxDecodedBytes from them before decoding a request.
//
// Where "0 = unlimited" is stated, 0 disables that limit; every other field
// must be positive.
type TenantLimits struct {
	// MaxSeriesPerCluster caps the active series of one cluster. 0 = unlimited.
	MaxSeriesPerCluster int
	// MaxSeriesPerTenant caps the active series of the tenant. 0 = unlimited.
	MaxSeriesPerTenant int
	// MaxSeriesPerMetric caps the active series of one metric name within the
	// tenant (across its clusters). 0 = unlimited.
	MaxSeriesPerMetric int
	// MaxLabelNamesPerSeries caps the number of labels of a series, __name__
	// included. 0 = unlimited.
	MaxLabelNamesPerSeries int
	// MaxLabelNameLength caps the length in bytes of a label name. 0 = unlimited.
	MaxLabelNameLength int
	// MaxLabelValueLength caps the length in bytes of a label value. 0 = unlimited.
	MaxLabelValueLength int
	// SamplesPerSecondPerCluster is the refill rate of each cluster's token
	// bucket, which holds at most BurstPerCluster samples and starts full.
	// 0 = unlimited (BurstPerCluster is then ignored).
	SamplesPerSecondPerCluster float64
	BurstPerCluster            int
	// SamplesPerSecondPerTenant and BurstPerTenant are the same for the sum
	// over all clusters of the tenant. 0 = unlimited.
	SamplesPerSecondPerTenant float64
	BurstPerTenant            int
	// SeriesIdleTimeout: a series not written for longer than this stops
	// counting towards the series limits (at the next Expire).
	SeriesIdleTimeout time.Duration
	// MaxBodyBytes caps the compressed request body.
	MaxBodyBytes int64
	// MaxDecodedBytes caps the decompressed request body.
	MaxDecodedBytes int64
	// MaxInflightRequestsPerCluster caps the write requests of one cluster
	// being served at the same time; more are refused (429) before their
	// body is read. A forwarder sends one at a time. 0 = unlimited.
	MaxInflightRequestsPerCluster int
}

// DefaultTenantLimits returns the built-in defaults. They are sized for
// telemetry: a cluster sends a few thousand series every few minutes, and a
// forwarder returning from an outage drains up to 2 h of backlog, which the
// per-cluster burst lets through quickly before the sustained rate applies.
func DefaultTenantLimits() TenantLimits {
	return TenantLimits{
		MaxSeriesPerCluster:        10_000,
		MaxSeriesPerTenant:         5_000_000,
		MaxSeriesPerMetric:         1_000_000,
		MaxLabelNamesPerSeries:     64,
		MaxLabelNameLength:         256,
		MaxLabelValueLength:        4096,
		SamplesPerSecondPerCluster: 1000,
		BurstPerCluster:            200_000,
		SamplesPerSecondPerTenant:  1_000_000,
		BurstPerTenant:             2_000_000,
		SeriesIdleTimeout:          30 * time.Minute,
		MaxBodyBytes:               8 << 20,
		MaxDecodedBytes:            32 << 20,
		// A forwarder has one request in flight at a time. A Prometheus
		// remote-writing directly shards (up to max_shards, 50 by
		// default): give its tenant an override, or it is slowed by 429s.
		MaxInflightRequestsPerCluster: 8,
	}
}

// SetDefaults writes the built-in default into every unset field of
// c.Defaults, so that the effective configuration can be printed. Tenant
// overrides are left sparse: their unset fields keep inheriting. Calling it
// is optional (resolution falls back to the built-in defaults anyway) and
// idempotent.
func (c *Config) SetDefaults() {
	d := DefaultTenantLimits()
	s := &c.Defaults
	setInt := func(p **int, v int) {
		if *p == nil {
			*p = &v
		}
	}
	setFloat := func(p **float64, v float64) {
		if *p == nil {
			*p = &v
		}
	}
	setBytes := func(p **units.Base2Bytes, v int64) {
		if *p == nil {
			b := units.Base2Bytes(v)
			*p = &b
		}
	}
	setInt(&s.MaxSeriesPerCluster, d.MaxSeriesPerCluster)
	setInt(&s.MaxSeriesPerTenant, d.MaxSeriesPerTenant)
	setInt(&s.MaxSeriesPerMetric, d.MaxSeriesPerMetric)
	setInt(&s.MaxLabelNamesPerSeries, d.MaxLabelNamesPerSeries)
	setInt(&s.MaxLabelNameLength, d.MaxLabelNameLength)
	setInt(&s.MaxLabelValueLength, d.MaxLabelValueLength)
	setFloat(&s.SamplesPerSecondPerCluster, d.SamplesPerSecondPerCluster)
	setInt(&s.BurstPerCluster, d.BurstPerCluster)
	setFloat(&s.SamplesPerSecondPerTenant, d.SamplesPerSecondPerTenant)
	setInt(&s.BurstPerTenant, d.BurstPerTenant)
	if s.SeriesIdleTimeout == nil {
		v := model.Duration(d.SeriesIdleTimeout)
		s.SeriesIdleTimeout = &v
	}
	setBytes(&s.MaxBodyBytes, d.MaxBodyBytes)
	setBytes(&s.MaxDecodedBytes, d.MaxDecodedBytes)
	setInt(&s.MaxInflightRequestsPerCluster, d.MaxInflightRequestsPerCluster)
}

// apply returns base with every field set in s overriding it.
func (s *Spec) apply(base TenantLimits) TenantLimits {
	r := base
	if s.MaxSeriesPerCluster != nil {
		r.MaxSeriesPerCluster = *s.MaxSeriesPerCluster
	}
	if s.MaxSeriesPerTenant != nil {
		r.MaxSeriesPerTenant = *s.MaxSeriesPerTenant
	}
	if s.MaxSeriesPerMetric != nil {
		r.MaxSeriesPerMetric = *s.MaxSeriesPerMetric
	}
	if s.MaxLabelNamesPerSeries != nil {
		r.MaxLabelNamesPerSeries = *s.MaxLabelNamesPerSeries
	}
	if s.MaxLabelNameLength != nil {
		r.MaxLabelNameLength = *s.MaxLabelNameLength
	}
	if s.MaxLabelValueLength != nil {
		r.MaxLabelValueLength = *s.MaxLabelValueLength
	}
	if s.SamplesPerSecondPerCluster != nil {
		r.SamplesPerSecondPerCluster = *s.SamplesPerSecondPerCluster
	}
	if s.BurstPerCluster != nil {
		r.BurstPerCluster = *s.BurstPerCluster
	}
	if s.SamplesPerSecondPerTenant != nil {
		r.SamplesPerSecondPerTenant = *s.SamplesPerSecondPerTenant
	}
	if s.BurstPerTenant != nil {
		r.BurstPerTenant = *s.BurstPerTenant
	}
	if s.SeriesIdleTimeout != nil {
		r.SeriesIdleTimeout = time.Duration(*s.SeriesIdleTimeout)
	}
	if s.MaxBodyBytes != nil {
		r.MaxBodyBytes = int64(*s.MaxBodyBytes)
	}
	if s.MaxDecodedBytes != nil {
		r.MaxDecodedBytes = int64(*s.MaxDecodedBytes)
	}
	if s.MaxInflightRequestsPerCluster != nil {
		r.MaxInflightRequestsPerCluster = *s.MaxInflightRequestsPerCluster
	}
	return r
}

// resolved is the immutable, fully inherited form of a Config.
type resolved struct {
	defaults TenantLimits
	tenants  map[string]*TenantLimits
}

func (c *Config) resolve() *resolved {
	r := &resolved{
		defaults: c.Defaults.apply(DefaultTenantLimits()),
		tenants:  make(map[string]*TenantLimits, len(c.Tenants)),
	}
	for name, s := range c.Tenants {
		tl := s.apply(r.defaults)
		r.tenants[name] = &tl
	}
	return r
}

func (r *resolved) forTenant(tenant string) *TenantLimits {
	if tl, ok := r.tenants[tenant]; ok {
		return tl
	}
	return &r.defaults
}

// Validate reports every problem in c, each prefixed with its YAML path
// (limits.defaults.<key> or limits.tenants.<tenant>.<key>), joined with
// errors.Join. Unset fields are validated after inheritance, so an override
// that only sets max_body_bytes is checked against the inherited
// max_decoded_bytes.
func (c *Config) Validate() error {
	var errs []error
	r := c.resolve()
	errs = append(errs, validateSpec("limits.defaults", &c.Defaults, r.defaults)...)
	for _, name := range slices.Sorted(maps.Keys(c.Tenants)) {
		path := strictyaml.Join("limits.tenants", name)
		if name == "" {
			errs = append(errs, fmt.Errorf("%s: tenant name must not be empty", path))
		}
		s := c.Tenants[name]
		errs = append(errs, validateSpec(path, &s, *r.tenants[name])...)
	}
	return errors.Join(errs...)
}

// validateSpec checks the fields set in s, and the cross-field rules of the
// effective limits eff (reported at path only if s sets one of the fields
// involved, so an inherited problem is reported once, at defaults).
func validateSpec(path string, s *Spec, eff TenantLimits) []error {
	var errs []error
	nonNeg := func(key string, p *int) {
		if p != nil && *p < 0 {
			errs = append(errs, fmt.Errorf("%s.%s: must not be negative (0 = unlimited), got %d", path, key, *p))
		}
	}
	nonNeg("max_series_per_cluster", s.MaxSeriesPerCluster)
	nonNeg("max_series_per_tenant", s.MaxSeriesPerTenant)
	nonNeg("max_series_per_metric", s.MaxSeriesPerMetric)
	nonNeg("max_label_names_per_series", s.MaxLabelNamesPerSeries)
	nonNeg("max_label_name_length", s.MaxLabelNameLength)
	nonNeg("max_label_value_length", s.MaxLabelValueLength)
	nonNeg("max_inflight_requests_per_cluster", s.MaxInflightRequestsPerCluster)
	rateOK := func(key string, p *float64) {
		if p != nil && (*p < 0 || math.IsNaN(*p) || math.IsInf(*p, 0)) {
			errs = append(errs, fmt.Errorf("%s.%s: must be a finite number >= 0 (0 = unlimited), got %v", path, key, *p))
		}
	}
	rateOK("samples_per_second_per_cluster", s.SamplesPerSecondPerCluster)
	rateOK("samples_per_second_per_tenant", s.SamplesPerSecondPerTenant)
	burstOK := func(key string, p *int, pr *float64, rate float64, burst int) {
		if p != nil && *p < 0 {
			errs = append(errs, fmt.Errorf("%s.%s: must not be negative, got %d", path, key, *p))
			return
		}
		if (p != nil || pr != nil) && rate > 0 && burst < 1 {
			errs = append(errs, fmt.Errorf("%s.%s: must be at least 1 when the rate is limited, got %d", path, key, burst))
		}
	}
	burstOK("burst_per_cluster", s.BurstPerCluster, s.SamplesPerSecondPerCluster, eff.SamplesPerSecondPerCluster, eff.BurstPerCluster)
	burstOK("burst_per_tenant", s.BurstPerTenant, s.SamplesPerSecondPerTenant, eff.SamplesPerSecondPerTenant, eff.BurstPerTenant)
	if s.SeriesIdleTimeout != nil && time.Duration(*s.SeriesIdleTimeout) < time.Second {
		errs = append(errs, fmt.Errorf("%s.series_idle_timeout: must be at least 1s, got %s", path, s.SeriesIdleTimeout))
	}
	posBytes := func(key string, p *units.Base2Bytes) {
		if p != nil && *p <= 0 {
			errs = append(errs, fmt.Errorf("%s.%s: must be positive, got %d", path, key, int64(*p)))
		}
	}
	posBytes("max_body_bytes", s.MaxBodyBytes)
	posBytes("max_decoded_bytes", s.MaxDecodedBytes)
	if (s.MaxBodyBytes != nil || s.MaxDecodedBytes != nil) && eff.MaxBodyBytes > 0 && eff.MaxDecodedBytes < eff.MaxBodyBytes {
		errs = append(errs, fmt.Errorf("%s.max_decoded_bytes: %s must be at least max_body_bytes (%s)", path,
			units.Base2Bytes(eff.MaxDecodedBytes), units.Base2Bytes(eff.MaxBodyBytes)))
	}
	return errs
}
