package rules

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// Config is the `rules:` section of the receiver configuration. With no
// Files, rule evaluation is off.
type Config struct {
	// Files are globs of Prometheus rule files (relative to the configuration
	// file). Every tenant evaluates the same files.
	Files []string `yaml:"files"`
	// EvaluationInterval is the default interval of a group that sets none (1m).
	EvaluationInterval model.Duration `yaml:"evaluation_interval"`
	// ReloadInterval is how often the files are re-read and new tenants are
	// picked up (30s). SIGHUP is not needed.
	ReloadInterval model.Duration `yaml:"reload_interval"`
	// Alertmanagers receive the alerts of every tenant, with a tenant label.
	Alertmanagers []AlertmanagerConfig `yaml:"alertmanagers"`
	// ExternalURL is the base of the alerts' generator URLs (usually Grafana's
	// or the receiver's public URL). Optional.
	ExternalURL string `yaml:"external_url"`
	// Evaluate, true by default (nil means unset), makes this receiver
	// evaluate the rules. With several replicas exactly one evaluates
	// (true there, false on the others): it reads the fleet through its
	// peers and the bucket, writes the results once and sends each alert
	// once. See docs/rules.md for what happens while it is down.
	Evaluate *bool `yaml:"evaluate"`
}

// AlertmanagerConfig is one Alertmanager, by its base URL.
type AlertmanagerConfig struct {
	// URL is the Alertmanager's base URL, e.g. http://alertmanager:9093 (a
	// path is a prefix, as behind a proxy). Alerts go to <URL>/api/v2/alerts.
	URL string `yaml:"url"`
	// Timeout bounds one send (10s).
	Timeout model.Duration `yaml:"timeout"`
	// BearerTokenFile, when set, holds the token sent to the Alertmanager.
	BearerTokenFile string `yaml:"bearer_token_file"`
}

// SetDefaults fills every unset field.
func (c *Config) SetDefaults() {
	if c.EvaluationInterval == 0 {
		c.EvaluationInterval = model.Duration(time.Minute)
	}
	if c.ReloadInterval == 0 {
		c.ReloadInterval = model.Duration(30 * time.Second)
	}
	if c.Evaluate == nil {
		t := true
		c.Evaluate = &t
	}
	for i := range c.Alertmanagers {
		if c.Alertmanagers[i].Timeout == 0 {
			c.Alertmanagers[i].Timeout = model.Duration(10 * time.Second)
		}
	}
}

// ResolvePaths makes relative file names and globs relative to dir (the
// configuration file's directory).
func (c *Config) ResolvePaths(dir string) {
	for i, f := range c.Files {
		if f != "" && !filepath.IsAbs(f) {
			c.Files[i] = filepath.Join(dir, f)
		}
	}
	for i, am := range c.Alertmanagers {
		if am.BearerTokenFile != "" && !filepath.IsAbs(am.BearerTokenFile) {
			c.Alertmanagers[i].BearerTokenFile = filepath.Join(dir, am.BearerTokenFile)
		}
	}
}

// Validate reports every problem with its YAML path. The rule files
// themselves are checked by Load (at start) and on every reload.
func (c *Config) Validate() error {
	var errs []error
	for i, f := range c.Files {
		if _, err := filepath.Match(f, ""); err != nil || f == "" {
			errs = append(errs, fmt.Errorf("rules.files[%d]: %q is not a valid glob", i, f))
		}
	}
	if c.EvaluationInterval < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("rules.evaluation_interval: %s is shorter than 1s", c.EvaluationInterval))
	}
	if c.ReloadInterval < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("rules.reload_interval: %s is shorter than 1s", c.ReloadInterval))
	}
	if c.ExternalURL != "" {
		if u, err := url.Parse(c.ExternalURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("rules.external_url: %q is not an http(s) URL", c.ExternalURL))
		}
	}
	for i, am := range c.Alertmanagers {
		u, err := url.Parse(am.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
			errs = append(errs, fmt.Errorf("rules.alertmanagers[%d].url: %q is not an http(s) base URL", i, am.URL))
		}
		if am.Timeout <= 0 {
			errs = append(errs, fmt.Errorf("rules.alertmanagers[%d].timeout: must be positive", i))
		}
	}
	if len(c.Alertmanagers) > 0 && len(c.Files) == 0 {
		errs = append(errs, errors.New("rules.alertmanagers: set, but rules.files is empty: nothing would ever be sent"))
	}
	return errors.Join(errs...)
}

// enabled reports whether any rule files are configured.
func (c *Config) enabled() bool { return len(c.Files) > 0 }

// evaluates reports whether this receiver evaluates the configured rules.
func (c *Config) evaluates() bool { return c.enabled() && (c.Evaluate == nil || *c.Evaluate) }

func trimSlash(s string) string { return strings.TrimRight(s, "/") }
