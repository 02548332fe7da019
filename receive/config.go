package receive

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/common/model"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/internal/strictyaml"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/peers"
	"github.com/phonehome/phonehome/push"
	"github.com/phonehome/phonehome/rules"
	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
	"github.com/phonehome/phonehome/storage/lifecycle"
	"github.com/phonehome/phonehome/upstream"
)

// Config is the receiver's YAML configuration file. Unknown keys are errors.
type Config struct {
	Auth   AuthConfig    `yaml:"auth"`
	Limits limits.Config `yaml:"limits"`
	// Allowlist, when set, is the server-side allowlist: series selectors
	// (PromQL syntax, as the forwarder's) outside of which nothing is stored.
	Allowlist []string `yaml:"allowlist"`
	// ElideLabels are removed from every series before it is stored.
	ElideLabels []string       `yaml:"elide_labels"`
	Storage     storage.Config `yaml:"storage"`
	Push        push.Config    `yaml:"push"`
	// Rules are the fleet rule files every tenant evaluates, and where
	// their alerts go; see docs/rules.md.
	Rules rules.Config `yaml:"rules"`
	// BucketStore reads every replica's blocks from the bucket for queries.
	BucketStore bucketstore.Config `yaml:"bucket_store"`
	// Compactor compacts the bucket's blocks (one receiver per bucket).
	Compactor lifecycle.CompactorConfig `yaml:"compactor"`
	// Upstream forwards accepted writes to a remote-write endpoint.
	Upstream upstream.Config `yaml:"upstream"`
	// RemoteWrite configures the remote-write endpoint (accepted versions).
	RemoteWrite RemoteWriteConfig `yaml:"remote_write"`
	// Telemeter configures Telemeter's paths (/upload, /metrics/v1/receive).
	Telemeter TelemeterPathsConfig `yaml:"telemeter"`
	// Gathering serves and enforces a gathering definition.
	Gathering GatheringConfig `yaml:"gathering"`
	// Peers are the other replicas, read for fresh fleet-wide queries;
	// see docs/scale-out.md.
	Peers peers.Config `yaml:"peers"`
}

// AuthConfig names where credentials come from. Relative paths are
// relative to the configuration file.
type AuthConfig struct {
	// TokensFile maps bearer tokens to tenants; see auth.TokensFile. It and
	// KeysFile are re-read every ReloadInterval, on SIGHUP and on POST
	// /-/reload, so revoking a token or rotating a key needs no restart.
	TokensFile     string         `yaml:"tokens_file"`
	ReloadInterval model.Duration `yaml:"reload_interval"`
	// KeysFile holds the Ed25519 keys that sign cluster credentials; it
	// enables POST /authorize. See auth.KeysFile.
	KeysFile      string         `yaml:"keys_file"`
	CredentialTTL model.Duration `yaml:"credential_ttl"`
	// AuthorizeWebhook, when set, decides which fleet tokens may authorize
	// instead of the tokens file.
	AuthorizeWebhook *WebhookConfig `yaml:"authorize_webhook"`
	// IDMismatch is what happens to a series whose _id differs from the
	// credential's cluster: "reject" (400, counted; the default) or
	// "overwrite" (the credential's _id replaces it).
	IDMismatch string `yaml:"id_mismatch"`
	// ClusterIDHash, when set, stores the cluster ids that clusters send in
	// clear (telemeter-client's /authorize, Prometheus' telemetry
	// remote-write) only as keyed hashes; see auth.ClusterIDHasher.
	ClusterIDHash *ClusterIDHashConfig `yaml:"cluster_id_hash"`
	// Telemeter configures Telemeter's remote-write path,
	// POST /metrics/v1/receive.
	Telemeter TelemeterConfig `yaml:"telemeter"`
}

// ClusterIDHashConfig names the HMAC key of auth.cluster_id_hash.
type ClusterIDHashConfig struct {
	SecretFile string `yaml:"secret_file"`
	// Pseudonyms is what happens to a cluster id sent at /authorize or on
	// Telemeter's write path that already has the pseudonym's shape (what
	// a forwarder sends): "accept" (stored as it is; the default) or
	// "refuse" (400 at /authorize, 401 on the write path), for fleets whose
	// clusters all send raw ids, so that nobody can present a stored id.
	Pseudonyms string `yaml:"pseudonyms"`
}

// Values of auth.cluster_id_hash.pseudonyms.
const (
	PseudonymsAccept = "accept"
	PseudonymsRefuse = "refuse"
)

// TelemeterConfig bounds the caches of fleet-token answers on Telemeter's
// remote-write path (see auth.TelemeterOptions): a revoked token keeps
// writing at most TokenCacheTTL, a refused one is refused at most
// TokenCacheNegativeTTL after it becomes valid.
type TelemeterConfig struct {
	TokenCacheTTL         model.Duration `yaml:"token_cache_ttl"`
	TokenCacheNegativeTTL model.Duration `yaml:"token_cache_negative_ttl"`
	TokenCacheSize        int            `yaml:"token_cache_size"`
}

// Values of auth.id_mismatch.
const (
	IDMismatchReject    = "reject"
	IDMismatchOverwrite = "overwrite"
)

// WebhookConfig is an upstream authorizer; see auth.Webhook.
type WebhookConfig struct {
	URL     string         `yaml:"url"`
	Timeout model.Duration `yaml:"timeout"`
}

// SetDefaults fills every unset field.
func (a *AuthConfig) SetDefaults() {
	if a.ReloadInterval == 0 {
		a.ReloadInterval = model.Duration(time.Minute)
	}
	if a.CredentialTTL == 0 {
		a.CredentialTTL = model.Duration(time.Hour)
	}
	if a.IDMismatch == "" {
		a.IDMismatch = IDMismatchReject
	}
	if a.Telemeter.TokenCacheTTL == 0 {
		a.Telemeter.TokenCacheTTL = model.Duration(auth.DefaultTelemeterCacheTTL)
	}
	if a.Telemeter.TokenCacheNegativeTTL == 0 {
		a.Telemeter.TokenCacheNegativeTTL = model.Duration(auth.DefaultTelemeterNegativeCacheTTL)
	}
	if a.Telemeter.TokenCacheSize == 0 {
		a.Telemeter.TokenCacheSize = auth.DefaultTelemeterCacheSize
	}
	if a.ClusterIDHash != nil && a.ClusterIDHash.Pseudonyms == "" {
		a.ClusterIDHash.Pseudonyms = PseudonymsAccept
	}
	if a.AuthorizeWebhook != nil && a.AuthorizeWebhook.Timeout == 0 {
		a.AuthorizeWebhook.Timeout = model.Duration(5 * time.Second)
	}
}

// Validate reports every problem with its YAML path.
func (a *AuthConfig) Validate() error {
	var errs []error
	if a.CredentialTTL < model.Duration(time.Minute) {
		errs = append(errs, fmt.Errorf("auth.credential_ttl: %s is shorter than 1m", a.CredentialTTL))
	}
	if a.ReloadInterval < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("auth.reload_interval: %s is shorter than 1s", a.ReloadInterval))
	}
	if a.IDMismatch != IDMismatchReject && a.IDMismatch != IDMismatchOverwrite {
		errs = append(errs, fmt.Errorf("auth.id_mismatch: %q, want reject or overwrite", a.IDMismatch))
	}
	if h := a.ClusterIDHash; h != nil {
		if h.SecretFile == "" {
			errs = append(errs, errors.New("auth.cluster_id_hash.secret_file: required"))
		}
		if h.Pseudonyms != PseudonymsAccept && h.Pseudonyms != PseudonymsRefuse {
			errs = append(errs, fmt.Errorf("auth.cluster_id_hash.pseudonyms: %q, want accept or refuse", h.Pseudonyms))
		}
	}
	if a.Telemeter.TokenCacheTTL < 0 || a.Telemeter.TokenCacheTTL > model.Duration(time.Hour) {
		errs = append(errs, fmt.Errorf("auth.telemeter.token_cache_ttl: %s, want between 0 and 1h (a revoked token writes that long)", a.Telemeter.TokenCacheTTL))
	}
	if a.Telemeter.TokenCacheNegativeTTL < 0 || a.Telemeter.TokenCacheNegativeTTL > model.Duration(time.Hour) {
		errs = append(errs, fmt.Errorf("auth.telemeter.token_cache_negative_ttl: %s, want at most 1h, or 0 for the default 30s (a refused token stays refused that long after it becomes valid; refusals cannot be left uncached)", a.Telemeter.TokenCacheNegativeTTL))
	}
	if a.Telemeter.TokenCacheSize < 0 {
		errs = append(errs, fmt.Errorf("auth.telemeter.token_cache_size: %d is negative", a.Telemeter.TokenCacheSize))
	}
	if wh := a.AuthorizeWebhook; wh != nil {
		if u, err := url.Parse(wh.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("auth.authorize_webhook.url: %q is not an http(s) URL", wh.URL))
		}
		if a.KeysFile == "" {
			errs = append(errs, errors.New("auth.authorize_webhook: needs auth.keys_file to sign credentials"))
		}
	}
	return errors.Join(errs...)
}

// LoadConfig reads path strictly, expands the environment variables of
// storage.external_labels, applies defaults and validates. An empty path
// yields the defaults. Relative file paths inside the config are resolved
// against the config file's directory.
func LoadConfig(path string) (*Config, error) {
	cfg := &Config{}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read config: %w", err)
		}
		if err := strictyaml.Decode(b, cfg); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		cfg.resolvePaths(filepath.Dir(path))
		cfg.Rules.ResolvePaths(filepath.Dir(path))
		cfg.Upstream.ResolvePaths(filepath.Dir(path))
		cfg.Gathering.ResolvePaths(filepath.Dir(path))
		cfg.Peers.ResolvePaths(filepath.Dir(path))
	}
	// Before validation, which sees the values the receiver uses.
	expandErr := cfg.Storage.ExpandExternalLabels(os.LookupEnv)
	cfg.Rules.SetReplica(cfg.Storage.ExternalLabels["replica"])
	cfg.BucketStore.SetDefaults()
	cfg.Compactor.SetDefaults()
	cfg.Upstream.SetDefaults()
	cfg.Auth.SetDefaults()
	cfg.Limits.SetDefaults()
	cfg.Storage.SetDefaults()
	cfg.Push.SetDefaults()
	cfg.Rules.SetDefaults()
	cfg.RemoteWrite.SetDefaults()
	cfg.Telemeter.SetDefaults()
	cfg.Gathering.SetDefaults()
	cfg.Peers.SetDefaults()
	if err := errors.Join(expandErr, cfg.Gathering.Validate(), cfg.Auth.Validate(), cfg.Limits.Validate(), cfg.Storage.Validate(), cfg.Push.Validate(), cfg.Rules.Validate(), cfg.BucketStore.Validate(), cfg.Compactor.Validate(), cfg.Upstream.Validate(), cfg.RemoteWrite.Validate(), cfg.Telemeter.Validate(), cfg.Peers.Validate(), cfg.validatePolicy()); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// validatePolicy compiles the allowlist once, and checks the files the
// config names exist, so a config that validates cannot fail later.
func (c *Config) validatePolicy() error {
	var errs []error
	if len(c.Allowlist) > 0 {
		if _, err := allowlist.Parse(c.Allowlist); err != nil {
			errs = append(errs, fmt.Errorf("allowlist: %w", err))
		}
	}
	if f := c.Storage.Bucket.S3.SecretKeyFile; c.Storage.Bucket.Type == "s3" && f != "" {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("storage.bucket.s3.secret_key_file: %w", err))
		}
	}
	if f := c.Upstream.BearerTokenFile; c.Upstream.URL != "" && f != "" {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("upstream.bearer_token_file: %w", err))
		}
	}
	for i, am := range c.Rules.Alertmanagers {
		if am.BearerTokenFile != "" {
			if _, err := os.Stat(am.BearerTokenFile); err != nil {
				errs = append(errs, fmt.Errorf("rules.alertmanagers[%d].bearer_token_file: %w", i, err))
			}
		}
	}
	for i, n := range c.ElideLabels {
		switch {
		case !model.LegacyValidation.IsValidLabelName(n):
			errs = append(errs, fmt.Errorf("elide_labels[%d]: %q is not a label name", i, n))
		case n == model.MetricNameLabel || n == clusterLabel:
			errs = append(errs, fmt.Errorf("elide_labels[%d]: %q cannot be elided", i, n))
		}
	}
	return errors.Join(errs...)
}

func (c *Config) resolvePaths(dir string) {
	paths := []*string{&c.Auth.TokensFile, &c.Auth.KeysFile, &c.Storage.Bucket.S3.SecretKeyFile}
	if c.Auth.ClusterIDHash != nil {
		paths = append(paths, &c.Auth.ClusterIDHash.SecretFile)
	}
	for _, p := range paths {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
}
