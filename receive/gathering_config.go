package receive

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/prometheus/common/model"
)

// GatheringConfig is the `gathering:` section: the gathering definition
// file (see package gathering) served at GET /api/v1/gathering and enforced
// server-side. Without File, neither happens.
type GatheringConfig struct {
	// File is hot-reloaded every ReloadInterval and on SIGHUP; an invalid
	// version is logged and counted, and the previous one stays. Relative
	// to the configuration file.
	File string `yaml:"file"`
	// GracePeriod: after a change, the previous definition's selectors are
	// still accepted this long, so forwarders that have not polled yet (or
	// deliver a backlog) are not refused (default 6h).
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
// validated when it is loaded (gathering.NewServer).
func (g *GatheringConfig) Validate() error {
	var errs []error
	if g.GracePeriod < 0 {
		errs = append(errs, fmt.Errorf("gathering.grace_period: %s is negative", g.GracePeriod))
	}
	if g.ReloadInterval < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("gathering.reload_interval: %s is shorter than 1s", g.ReloadInterval))
	}
	return errors.Join(errs...)
}

// ResolvePaths makes File absolute against the config file's directory.
func (g *GatheringConfig) ResolvePaths(dir string) {
	if g.File != "" && !filepath.IsAbs(g.File) {
		g.File = filepath.Join(dir, g.File)
	}
}
