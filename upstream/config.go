package upstream

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"time"

	"github.com/alecthomas/units"
	"github.com/prometheus/common/model"
)

// Modes of Config.Mode.
const (
	// ModeAlso stores writes locally (the acknowledgement) and forwards them.
	ModeAlso = "also"
	// ModeForwardOnly forwards writes without storing them locally; they are
	// acknowledged once in the durable upstream queue.
	ModeForwardOnly = "forward_only"
)

// Config is the `upstream:` section of the receiver config. Forwarding is off
// while URL is empty. Call SetDefaults, then Validate.
type Config struct {
	// URL is the upstream's full remote-write URL, e.g.
	// http://prometheus:9090/api/v1/write, http://thanos-receive:19291/api/v1/receive,
	// http://mimir:8080/api/v1/push, http://victoria:8428/api/v1/write.
	URL string `yaml:"url"`
	// BearerTokenFile, if set, is read before every request (so it can rotate).
	BearerTokenFile string `yaml:"bearer_token_file"`
	// Mode is also (default) or forward_only.
	Mode string `yaml:"mode"`
	// TenantHeader, if set, carries the writer's tenant to the upstream
	// (THANOS-TENANT for Thanos Receive, X-Scope-OrgID for Mimir).
	TenantHeader string `yaml:"tenant_header"`
	// Tenant, if set, is sent in TenantHeader instead of the writer's
	// tenant: one upstream tenant for every write, as telemeter-server's
	// --tenant-id puts all its clusters' uploads in one Thanos tenant.
	Tenant string `yaml:"tenant"`
	// Timeout bounds one upstream request.
	Timeout model.Duration `yaml:"timeout"`
	Queue   QueueConfig    `yaml:"queue"`
}

// QueueConfig bounds the on-disk queue in front of the upstream.
type QueueConfig struct {
	// MaxBytes bounds the queue on disk. In forward_only mode a full queue
	// refuses new writes with 503 (the client keeps and retries them); in
	// also mode the write is stored locally and the upstream copy is dropped
	// and counted.
	MaxBytes units.Base2Bytes `yaml:"max_bytes"`
	// MinBackoff and MaxBackoff bound the capped exponential retry delay.
	MinBackoff model.Duration `yaml:"min_backoff"`
	MaxBackoff model.Duration `yaml:"max_backoff"`
}

// Enabled reports whether writes are forwarded.
func (c *Config) Enabled() bool { return c.URL != "" }

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.Mode == "" {
		c.Mode = ModeAlso
	}
	if c.Timeout == 0 {
		c.Timeout = model.Duration(30 * time.Second)
	}
	if c.Queue.MaxBytes == 0 {
		c.Queue.MaxBytes = 256 * units.MiB
	}
	if c.Queue.MinBackoff == 0 {
		c.Queue.MinBackoff = model.Duration(500 * time.Millisecond)
	}
	if c.Queue.MaxBackoff == 0 {
		c.Queue.MaxBackoff = model.Duration(30 * time.Second)
	}
}

// ResolvePaths makes BearerTokenFile relative to the config file's directory.
func (c *Config) ResolvePaths(dir string) {
	if c.BearerTokenFile != "" && !filepath.IsAbs(c.BearerTokenFile) {
		c.BearerTokenFile = filepath.Join(dir, c.BearerTokenFile)
	}
}

// Validate reports every problem with its YAML path.
func (c *Config) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("upstream.%s: %s", path, fmt.Sprintf(format, args...)))
	}
	if c.URL == "" {
		if c.BearerTokenFile != "" || c.TenantHeader != "" || c.Tenant != "" || c.Mode == ModeForwardOnly {
			bad("url", "required when other upstream settings are set")
		}
		return errors.Join(errs...)
	}
	if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("url", "%q is not an http(s) URL", c.URL)
	}
	if c.Mode != ModeAlso && c.Mode != ModeForwardOnly {
		bad("mode", "%q, want %s or %s", c.Mode, ModeAlso, ModeForwardOnly)
	}
	if c.TenantHeader != "" && http.CanonicalHeaderKey(c.TenantHeader) == "" {
		bad("tenant_header", "%q is not a header name", c.TenantHeader)
	}
	if c.Tenant != "" && c.TenantHeader == "" {
		bad("tenant", "needs tenant_header, the header that carries it")
	}
	if c.Timeout < model.Duration(time.Second) {
		bad("timeout", "%s is shorter than 1s", c.Timeout)
	}
	if c.Queue.MaxBytes < units.MiB {
		bad("queue.max_bytes", "%s is smaller than 1MiB", c.Queue.MaxBytes)
	}
	if c.Queue.MinBackoff <= 0 || c.Queue.MaxBackoff < c.Queue.MinBackoff {
		bad("queue.max_backoff", "%s must be at least queue.min_backoff %s (> 0)", c.Queue.MaxBackoff, c.Queue.MinBackoff)
	}
	return errors.Join(errs...)
}
