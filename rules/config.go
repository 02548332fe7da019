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
	// picked up (30s). The receiver's SIGHUP and POST /-/reload re-read
	// the files at once.
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
	// once. See docs/rules.md for what happens while it is down. Replicas
	// that share one configuration file use EvaluatorReplica instead.
	Evaluate *bool `yaml:"evaluate"`
	// EvaluatorReplica, instead of Evaluate, names the replica that
	// evaluates: this receiver evaluates iff its
	// storage.external_labels.replica equals it. Every replica can then
	// share one configuration file (a StatefulSet's ConfigMap with
	// `replica: ${POD_NAME}` and `evaluator_replica: phonehome-receiver-0`).
	EvaluatorReplica string `yaml:"evaluator_replica"`

	// replica is this receiver's storage.external_labels.replica (SetReplica).
	replica string
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
	if c.Evaluate == nil && c.EvaluatorReplica == "" {
		t := true
		c.Evaluate = &t
	}
	for i := range c.Alertmanagers {
		if c.Alertmanagers[i].Timeout == 0 {
			c.Alertmanagers[i].Timeout = model.Duration(10 * time.Second)
		}
	}
}

// SetReplica tells the configuration this receiver's
// storage.external_labels.replica (after expansion), which EvaluatorReplica
// is compared with. Call it before Validate.
func (c *Config) SetReplica(replica string) { c.replica = replica }

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
	if c.EvaluatorReplica != "" {
		// SetDefaults leaves Evaluate unset beside EvaluatorReplica: set, the file sets both.
		if c.Evaluate != nil {
			errs = append(errs, errors.New("rules.evaluator_replica: set together with rules.evaluate: set one (evaluator_replica when the replicas share one configuration)"))
		}
		if c.replica == "" {
			errs = append(errs, fmt.Errorf("rules.evaluator_replica: %q, but storage.external_labels.replica is not set: it is what evaluator_replica is compared with", c.EvaluatorReplica))
		}
	}
	if len(c.Alertmanagers) > 0 && len(c.Files) == 0 {
		errs = append(errs, errors.New("rules.alertmanagers: set, but rules.files is empty: nothing would ever be sent"))
	}
	return errors.Join(errs...)
}

// enabled reports whether any rule files are configured.
func (c *Config) enabled() bool { return len(c.Files) > 0 }

// Evaluates reports whether this receiver evaluates the configured rules:
// some are configured, and rules.evaluate is true or unset, or
// rules.evaluator_replica names this replica.
func (c *Config) Evaluates() bool {
	switch {
	case !c.enabled():
		return false
	case c.EvaluatorReplica != "":
		return c.replica == c.EvaluatorReplica
	default:
		return c.Evaluate == nil || *c.Evaluate
	}
}

func trimSlash(s string) string { return strings.TrimRight(s, "/") }
