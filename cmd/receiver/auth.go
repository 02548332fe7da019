package main

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/receive"
)

// authSetup is the receiver's authentication, built from the config.
type authSetup struct {
	authn     auth.Authenticator
	telemeter auth.Authenticator     // Telemeter's remote-write path: base64 JSON bearer
	tokens    *auth.FileTokens       // nil under --insecure.no-auth
	authorize *auth.AuthorizeHandler // nil without auth.keys_file
	keys      *auth.FileKeys         // nil without auth.keys_file
}

// setupAuth builds the configured authentication. Running without any
// needs the explicit --insecure.no-auth flag.
func setupAuth(logger *slog.Logger, reg prometheus.Registerer, cfg receive.AuthConfig, noAuth bool) (authSetup, error) {
	switch {
	case cfg.TokensFile != "" && noAuth:
		return authSetup{}, errors.New("auth.tokens_file and --insecure.no-auth are mutually exclusive")
	case noAuth:
		insecure := auth.Insecure{Tenant: defaultTenant}
		return authSetup{authn: insecure, telemeter: insecure}, nil
	case cfg.TokensFile == "":
		return authSetup{}, errors.New("no authentication configured: set auth.tokens_file in --config.file, or pass --insecure.no-auth for a local trial")
	}
	tokens, err := auth.NewFileTokens(logger, reg, cfg.TokensFile)
	if err != nil {
		return authSetup{}, err
	}
	var hasher *auth.ClusterIDHasher
	if cfg.ClusterIDHash != nil {
		if hasher, err = auth.LoadClusterIDHasher(cfg.ClusterIDHash.SecretFile); err != nil {
			return authSetup{}, err
		}
		hasher.RefusePseudonyms = cfg.ClusterIDHash.Pseudonyms == receive.PseudonymsRefuse
	}
	// /authorize and Telemeter's write path each ask the fleet authorizer
	// through their own webhook client, so that each has its own bound of
	// lookups in flight: a flood of made-up tokens at one does not starve
	// the other (known clusters' writes, or their credential renewals).
	var fleet, writeFleet auth.FleetAuthorizer = tokens, tokens
	if wh := cfg.AuthorizeWebhook; wh != nil {
		fleet = auth.NewWebhook(wh.URL, &http.Client{Timeout: time.Duration(wh.Timeout)})
		writeFleet = auth.NewWebhook(wh.URL, &http.Client{Timeout: time.Duration(wh.Timeout)})
	}
	var static auth.Authenticator = tokens
	if hasher != nil { // a token bound to the raw id writes as its pseudonym
		static = auth.PseudonymTokens{Authenticator: tokens, Hasher: hasher}
	}
	s := authSetup{
		authn: static, tokens: tokens,
		telemeter: auth.NewTelemeterBearer(reg, writeFleet, auth.TelemeterOptions{
			Hasher:           hasher,
			CacheTTL:         time.Duration(cfg.Telemeter.TokenCacheTTL),
			NegativeCacheTTL: time.Duration(cfg.Telemeter.TokenCacheNegativeTTL),
			CacheSize:        cfg.Telemeter.TokenCacheSize,
			Logger:           logger,
		}),
	}
	if cfg.KeysFile == "" {
		return s, nil
	}
	keys, err := auth.NewFileKeys(logger, reg, cfg.KeysFile)
	if err != nil {
		return authSetup{}, err
	}
	s.keys = keys
	issuer := auth.NewIssuer(keys, time.Duration(cfg.CredentialTTL), nil)
	issuer.Hasher = hasher // a raw id sent at /authorize is sealed in the credential, and rewritten on its writes
	s.authn = auth.Chain{Issuer: issuer, Static: static}
	s.authorize = auth.NewAuthorizeHandler(logger, reg, fleet, issuer)
	return s, nil
}

// warnAuth logs the tokens whose permissions the configuration makes
// risky or useless, by name (never the token). Warnings, not errors: an
// unbound writer is a choice, and a token that may only authorize still
// writes without auth.keys_file on Telemeter's /metrics/v1/receive,
// which checks its bearer's token for the authorize permission.
func warnAuth(logger *slog.Logger, a authSetup, cfg receive.AuthConfig) {
	warnKeys(logger, a)
	warnTokens(logger, a, cfg)
}

// warnKeys is warnAuth's part about the keys file: run again when a reload
// changes it (FileKeys.OnChange).
func warnKeys(logger *slog.Logger, a authSetup) {
	if a.keys == nil {
		return
	}
	keys := a.keys.Current()
	if kids := keys.ExampleKeys(); len(kids) > 0 {
		logger.Warn("auth.keys_file holds the repository's EXAMPLE signing key, whose private half is public: anyone can sign cluster credentials this receiver accepts; for a trial only, generate your own (openssl genpkey -algorithm ed25519, docs/operations.md)", "kids", kids)
	}
	if keys.NoneCreated(time.Now()) {
		logger.Warn("no key of auth.keys_file has reached its created time: the oldest signs until the first one does; a rotation keeps the old key in the file until the new one's created has passed (docs/operations.md)")
	}
}

// warnTokens is warnAuth's part about the tokens file: run again when a
// reload changes it (FileTokens.OnChange).
func warnTokens(logger *slog.Logger, a authSetup, cfg receive.AuthConfig) {
	if a.tokens == nil {
		return
	}
	if names := a.tokens.UnboundWriters(); len(names) > 0 {
		logger.Warn("tokens may write series for any cluster of their tenant; give clusters authorize-only fleet tokens (allow: [authorize]) or bind tokens with cluster_id", "tokens", names)
	}
	switch names := a.tokens.ExchangeOnly(); {
	case len(names) == 0:
	case cfg.AuthorizeWebhook != nil:
		logger.Warn("tokens allow authorize but not write, and auth.authorize_webhook decides every /authorize and Telemeter bearer: the tokens file is never asked for them, so they deliver nothing; register them with the webhook, or remove them", "tokens", names)
	case a.authorize == nil:
		logger.Warn("tokens allow authorize but not write, and POST /authorize is off without auth.keys_file: a forwarder holding one is refused (403) on every write, telemeter-client at /authorize (404); set auth.keys_file (without it they write only as Prometheus' telemetry bearer, on /metrics/v1/receive)", "tokens", names)
	}
}

// reloadingFiles returns a's files that are re-read while the receiver
// runs (the tokens file, the keys file), each set to warn again, as at
// start, when a reload changes it.
func (a authSetup) reloadingFiles(logger *slog.Logger, cfg receive.AuthConfig) []reloadingFile {
	var files []reloadingFile
	if a.tokens != nil {
		a.tokens.OnChange = func() { warnTokens(logger, a, cfg) } // a token added by a reload is warned about too
		files = append(files, a.tokens)
	}
	if a.keys != nil {
		a.keys.OnChange = func() { warnKeys(logger, a) } // so is the example key
		files = append(files, a.keys)
	}
	return files
}
