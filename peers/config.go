package peers

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/common/model"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/webtls"
)

// Config is the `peers:` section of the receiver configuration: the other
// replicas whose heads queries read through remote read. Empty Endpoints
// means a single receiver (queries read the local TSDB and the bucket).
type Config struct {
	// Endpoints are the peers, as Thanos and Prometheus spell them:
	// "host:port" (static), "dns+host:port" (every A/AAAA record of host,
	// e.g. a headless Service) or "dnssrv+_name._tcp.host" (every SRV
	// record, each target resolved to its addresses). The receiver's own
	// address may be listed (a headless Service lists every pod): a receiver
	// recognises itself by its instance id and never reads from itself.
	Endpoints []string `yaml:"endpoints"`
	// Scheme is http (default) or https.
	Scheme string `yaml:"scheme"`
	// TLSConfig verifies the peers (https) and, with cert_file and
	// key_file, presents a client certificate to peers that require one
	// (their --web.config.file with client_auth_type).
	TLSConfig webtls.ClientConfig `yaml:"tls_config"`
	// RefreshInterval is how often DNS endpoints are resolved and token
	// files re-read (30s).
	RefreshInterval model.Duration `yaml:"refresh_interval"`
	// Timeout bounds one remote read of a peer (30s); a peer that does not
	// answer in time is a warning, not a failed query.
	Timeout model.Duration `yaml:"timeout"`
	// ReplicaTokenFile holds a token shared by the replicas only. With it a
	// replica reads any tenant's local data of a peer, naming the tenant in
	// a header, and nothing else (not the fleet view, not the query API).
	// The same file on every replica: it both sends and accepts it. To
	// rotate it, the file may hold further tokens, one per line: the first
	// is sent, every one is accepted (docs/operations.md).
	ReplicaTokenFile string `yaml:"replica_token_file"`
	// TenantTokenFiles map a tenant to a file holding one of its read
	// tokens (of the peers' tokens file). Used for that tenant instead of
	// the replica token; the peer then takes the tenant from the token, as
	// for any reader.
	TenantTokenFiles map[string]string `yaml:"tenant_token_files"`
	// HorizonTTL is how long a peer's reported horizon is trusted to skip
	// it for queries that end before it (1m); see docs/scale-out.md.
	HorizonTTL model.Duration `yaml:"horizon_ttl"`
	// Pushdown (default true) evaluates the parts of a query that keep
	// clusters apart on each replica and combines the answers, when that
	// is exact (docs/scale-out.md); false always reads the peers' series.
	Pushdown *bool `yaml:"pushdown"`
}

// PushdownEnabled reports whether Pushdown is on (the default).
func (c *Config) PushdownEnabled() bool { return c.Pushdown == nil || *c.Pushdown }

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.Scheme == "" {
		c.Scheme = "http"
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = model.Duration(30 * time.Second)
	}
	if c.Timeout == 0 {
		c.Timeout = model.Duration(30 * time.Second)
	}
	if c.HorizonTTL == 0 {
		c.HorizonTTL = model.Duration(time.Minute)
	}
}

// ResolvePaths makes relative token files relative to dir.
func (c *Config) ResolvePaths(dir string) {
	abs := func(p string) string {
		if p != "" && !filepath.IsAbs(p) {
			return filepath.Join(dir, p)
		}
		return p
	}
	c.ReplicaTokenFile = abs(c.ReplicaTokenFile)
	c.TLSConfig.CAFile = abs(c.TLSConfig.CAFile)
	c.TLSConfig.CertFile = abs(c.TLSConfig.CertFile)
	c.TLSConfig.KeyFile = abs(c.TLSConfig.KeyFile)
	for t, f := range c.TenantTokenFiles {
		c.TenantTokenFiles[t] = abs(f)
	}
}

// Validate reports every problem with its YAML path, including token files
// that cannot be read.
func (c *Config) Validate() error {
	var errs []error
	for i, e := range c.Endpoints {
		if _, err := parseEndpoint(e); err != nil {
			errs = append(errs, fmt.Errorf("peers.endpoints[%d]: %w", i, err))
		}
	}
	if c.Scheme != "http" && c.Scheme != "https" {
		errs = append(errs, fmt.Errorf("peers.scheme: %q, want http or https", c.Scheme))
	}
	if err := c.TLSConfig.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("peers.tls_config: %w", err))
	}
	if c.RefreshInterval < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("peers.refresh_interval: %s is shorter than 1s", c.RefreshInterval))
	}
	if c.Timeout < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("peers.timeout: %s is shorter than 1s", c.Timeout))
	}
	if c.HorizonTTL < 0 {
		errs = append(errs, fmt.Errorf("peers.horizon_ttl: %s is negative", c.HorizonTTL))
	}
	if c.ReplicaTokenFile != "" {
		if _, err := readTokens(c.ReplicaTokenFile); err != nil {
			errs = append(errs, fmt.Errorf("peers.replica_token_file: %w", err))
		}
	}
	for t, f := range c.TenantTokenFiles {
		if !auth.ValidTenant(t) {
			errs = append(errs, fmt.Errorf("peers.tenant_token_files.%s: invalid tenant name", t))
		}
		if _, err := readToken(f); err != nil {
			errs = append(errs, fmt.Errorf("peers.tenant_token_files.%s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// endpoint is one parsed entry of Endpoints.
type endpoint struct {
	kind string // "", "dns" or "dnssrv"
	host string
	port string // empty for dnssrv
}

func parseEndpoint(s string) (endpoint, error) {
	kind, rest := "", s
	if i := strings.Index(s, "+"); i >= 0 {
		kind, rest = s[:i], s[i+1:]
	}
	switch kind {
	case "", "dns":
		host, port, err := net.SplitHostPort(rest)
		if err != nil || host == "" || port == "" {
			return endpoint{}, fmt.Errorf("%q: want host:port, dns+host:port or dnssrv+name", s)
		}
		return endpoint{kind: kind, host: host, port: port}, nil
	case "dnssrv":
		if rest == "" || strings.Contains(rest, ":") {
			return endpoint{}, fmt.Errorf("%q: dnssrv+ takes a name without a port", s)
		}
		return endpoint{kind: kind, host: rest}, nil
	default:
		return endpoint{}, fmt.Errorf("%q: unknown prefix %q+ (want dns+ or dnssrv+)", s, kind)
	}
}

// readToken reads a one-line secret.
func readToken(path string) (string, error) {
	toks, err := readTokens(path)
	if err != nil {
		return "", err
	}
	if len(toks) != 1 {
		return "", fmt.Errorf("%s: want one token, found %d lines of them", path, len(toks))
	}
	return toks[0], nil
}

// readTokens reads a file of one or more tokens, one per line (blank lines
// ignored), in file order.
func readTokens(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var toks []string
	for _, line := range strings.Split(string(b), "\n") {
		tok := strings.TrimSpace(line)
		if tok == "" {
			continue
		}
		if strings.ContainsAny(tok, " \t") {
			return nil, fmt.Errorf("%s: want one token per line", path)
		}
		toks = append(toks, tok)
	}
	if len(toks) == 0 {
		return nil, fmt.Errorf("%s: no token", path)
	}
	return toks, nil
}
