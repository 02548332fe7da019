package receive

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/common/model"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/gathering"
)

// GatheringConfig is the `gathering:` section: the gathering definition
// files (see package gathering) served at GET /api/v1/gathering and
// enforced server-side, per tenant. Without File nor Tenants, neither
// happens — except that the versions of definitions removed from it (the
// whole section included) stay accepted for GracePeriod.
type GatheringConfig struct {
	// File is the default definition, for every tenant not in Tenants.
	// Each file is hot-reloaded every ReloadInterval, on SIGHUP and on POST /-/reload; an
	// invalid version is logged and counted, and that tenant's previous one
	// stays. Paths are relative to the configuration file. The set of
	// tenants is read at start only.
	File string `yaml:"file"`
	// Tenants maps a tenant to its own definition file.
	Tenants map[string]string `yaml:"tenants"`
	// GracePeriod: each version a definition replaced (up to
	// gathering.MaxPrevious of them), and the last version of a removed
	// definition (a tenant's own, or the default), is still accepted this
	// long after its replacement, so forwarders that have not polled yet
	// (or deliver a backlog) are not refused (default 6h).
	GracePeriod    model.Duration `yaml:"grace_period"`
	ReloadInterval model.Duration `yaml:"reload_interval"` // default 30s
}

// SetDefaults fills every unset field.
func (g *GatheringConfig) SetDefaults() {
	if g.GracePeriod == 0 {
		g.GracePeriod = model.Duration(6 * time.Hour)
	}
	if g.ReloadInterval == 0 {
		g.ReloadInterval = model.Duration(30 * time.Second)
	}
}

// Validate reports every problem with its YAML path. The file itself is
// validated by CheckFiles.
func (g *GatheringConfig) Validate() error {
	var errs []error
	if g.GracePeriod < 0 {
		errs = append(errs, fmt.Errorf("gathering.grace_period: %s is negative", g.GracePeriod))
	}
	if g.ReloadInterval < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("gathering.reload_interval: %s is shorter than 1s", g.ReloadInterval))
	}
	for _, t := range slices.Sorted(maps.Keys(g.Tenants)) {
		if !auth.ValidTenant(t) {
			errs = append(errs, fmt.Errorf("gathering.tenants[%q]: not a valid tenant name", t))
		}
		if g.Tenants[t] == "" {
			errs = append(errs, fmt.Errorf("gathering.tenants[%q]: empty file name", t))
		}
	}
	return errors.Join(errs...)
}

// Enabled reports whether a definition is served and enforced.
func (g *GatheringConfig) Enabled() bool { return g.File != "" || len(g.Tenants) > 0 }

// Files are the definition files to serve.
func (g *GatheringConfig) Files() gathering.Files {
	return gathering.Files{Default: g.File, Tenants: maps.Clone(g.Tenants)}
}

// CheckFiles loads and validates every definition file (--check-config and
// start), reporting each problem with its YAML path. It is not part of
// Validate, so that a bad definition never fails a config reload: each file
// has its own reload, which keeps the previous version.
func (g *GatheringConfig) CheckFiles() error {
	var errs []error
	if g.File != "" {
		if _, err := gathering.Load(g.File); err != nil {
			errs = append(errs, fmt.Errorf("gathering.file: %w", err))
		}
	}
	for _, t := range slices.Sorted(maps.Keys(g.Tenants)) {
		if _, err := gathering.Load(g.Tenants[t]); err != nil {
			errs = append(errs, fmt.Errorf("gathering.tenants[%q]: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// ResolvePaths makes the files absolute against the config file's directory.
func (g *GatheringConfig) ResolvePaths(dir string) {
	abs := func(p string) string {
		if p != "" && !filepath.IsAbs(p) {
			return filepath.Join(dir, p)
		}
		return p
	}
	g.File = abs(g.File)
	for t, f := range g.Tenants {
		g.Tenants[t] = abs(f)
	}
}
