// Command forwarder runs inside a cluster: it federates allowlisted series
// from Prometheus, anonymizes the cluster identity and chosen labels, queues
// them on disk and remote-writes them to the fleet receiver.
//
// Telemetry is opt-out: with --disabled, or without --to, the forwarder logs
// once that it is disabled, serves /healthz, /readyz and /metrics, and sends
// nothing.
package main

import (
	"context"
	"crypto/tls"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alecthomas/units"
	oklogrun "github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/internal/buildversion"
	"github.com/phonehome/phonehome/relabel"
	"github.com/phonehome/phonehome/shutdown"
	"github.com/phonehome/phonehome/webtls"
)

// forwarderVersion is this build's version (internal/buildversion, as the
// receiver's): sent in the User-Agent (the status page lists the fleet's
// versions) and checked against a gathering definition's
// min_forwarder_version.
var forwarderVersion = buildversion.Of(version.Version)

var userAgent = "phonehome-forwarder/" + forwarderVersion

func init() { buildversion.Set() } // --version

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// sliceFlag is a repeatable flag whose values are also comma-separated
// lists, read as CSV like pflag's StringSlice (telemeter-client's --label,
// --rename and --anonymize-labels). An empty value adds nothing.
type sliceFlag []string

func (l *sliceFlag) String() string { return strings.Join(*l, ",") }
func (l *sliceFlag) Set(v string) error {
	if v == "" {
		return nil
	}
	rec, err := csv.NewReader(strings.NewReader(v)).Read()
	if err != nil {
		return fmt.Errorf("want a comma-separated list: %w", err)
	}
	*l = append(*l, rec...)
	return nil
}

type flags struct {
	from, fromTokenFile, fromCAFile  string
	to, toTokenFile, toCAFile        string
	id                               string
	matches                          listFlag
	elideLabels                      listFlag // one name per value, not comma-split (elidedLabels)
	labels, renames, anonymizeLabels sliceFlag
	matchFile                        string
	interval                         time.Duration
	saltFile                         string
	// telemeter-client's flags without a counterpart of ours.
	fromToken, toToken, salt           string // inline secrets
	toUpload, toAuth                   string
	limitBytes                         int64
	tlsCertFile, tlsKeyFile            string
	toCertFile, toKeyFile, webConfig   string
	verbose                            bool
	protocol                           string
	listen, configFile, gatheringURL   string
	queueDir                           string
	queueMaxBytes                      units.Base2Bytes
	logLevel, logFormat                string
	authorize                          string
	rwVersion                          string
	checkConfig, disabled, showVersion bool
	webEnableLifecycle                 bool
	set                                map[string]bool // flags given explicitly
}

func parseFlags(args []string, stderr io.Writer) (*flags, error) {
	f := &flags{set: map[string]bool{}}
	fs := flag.NewFlagSet("forwarder", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.from, "from", "", "Base URL of the in-cluster Prometheus to federate from.")
	fs.StringVar(&f.fromTokenFile, "from-token-file", "", "File with the bearer token for --from.")
	fs.StringVar(&f.fromCAFile, "from-ca-file", "", "PEM CA bundle to verify --from.")
	fs.StringVar(&f.to, "to", "", "Base URL of the fleet receiver. Empty disables telemetry.")
	fs.StringVar(&f.toTokenFile, "to-token-file", "", "File with the bearer token for --to (re-read on every request).")
	fs.StringVar(&f.toCAFile, "to-ca-file", "", "PEM CA bundle to verify --to.")
	fs.StringVar(&f.toCertFile, "to-cert-file", "", "Client certificate (PEM) presented to --to (and --gathering-url), for a receiver that requires one (mTLS); re-read when it changes. Needs --to-key-file.")
	fs.StringVar(&f.toKeyFile, "to-key-file", "", "Private key (PEM) of --to-cert-file.")
	fs.StringVar(&f.authorize, "authorize", forward.AuthorizeAuto, "Exchange the --to-token-file token at <to>/authorize for a short-lived cluster credential: auto (if the receiver has /authorize), always, or never (use the token directly).")
	fs.StringVar(&f.rwVersion, "remote-write.version", forward.VersionAuto, "Remote-write protocol: auto (2.0, falling back to 1.0 on a 415 or a 1.0 receiver, remembered in --queue.dir), 1 (e.g. Prometheus <= 2.x, which answers 2.0 with 400) or 2.")
	fs.StringVar(&f.id, "id", "", "Raw cluster id; only its keyed hash leaves the cluster, as label _id.")
	fs.StringVar(&f.protocol, "to-protocol", forward.ProtocolAuto, "Delivery protocol: remote-write (<to>/api/v1/write), telemeter (telemeter-client's /authorize + /upload, for a stock telemeter-server) or auto: telemeter if --to-upload or --to-auth is given; remote-write without a fleet token or with --authorize=never; otherwise the /authorize answer decides, telemeter only if it has telemeter-server's fields alone (no tenant, no expires_in_seconds).")
	fs.StringVar(&f.toUpload, "to-upload", "", "telemeter-client: the upload URL of a telemeter-server (default <to>/upload); implies --to-protocol=telemeter under auto.")
	fs.StringVar(&f.toAuth, "to-auth", "", "telemeter-client: the authorize URL of a telemeter-server (default <to>/authorize); its id parameter is always the hashed id. Implies --to-protocol=telemeter under auto.")
	fs.StringVar(&f.toToken, "to-token", "", "telemeter-client: the fleet token inline (accepted with a warning; prefer --to-token-file). Overrides --to-token-file.")
	fs.StringVar(&f.fromToken, "from-token", "", "telemeter-client: the bearer token for --from inline (accepted with a warning; prefer --from-token-file). Overrides --from-token-file.")
	fs.StringVar(&f.tlsCertFile, "tls-cert-file", "", "telemeter-client: client certificate (PEM) presented to --from; re-read when it changes. Needs --tls-private-key-file.")
	fs.StringVar(&f.tlsKeyFile, "tls-private-key-file", "", "telemeter-client: private key (PEM) of --tls-cert-file.")
	fs.Int64Var(&f.limitBytes, "limit-bytes", 0, "telemeter-client: bytes of a federate response kept per cycle (overrides federate.max_bytes; 0 = no cap). Beyond it samples are counted as dropped, the cycle is not failed.")
	fs.Var(&f.matches, "match", "Series selector to federate and allow (repeatable).")
	fs.StringVar(&f.matchFile, "match-file", "", "File with one series selector per line ('#' comments).")
	fs.DurationVar(&f.interval, "interval", forward.DefaultInterval, "Time between collections (jittered by ±10%).")
	fs.Var(&f.anonymizeLabels, "anonymize-labels", "Label names whose values are replaced by their keyed hash (comma-separated, repeatable; empty is allowed).")
	fs.StringVar(&f.saltFile, "anonymize-salt-file", "", "File with the secret per-cluster anonymization salt (>= 16 bytes).")
	fs.StringVar(&f.salt, "anonymize-salt", "", "telemeter-client: the salt inline (accepted with a warning; prefer --anonymize-salt-file). Overrides --anonymize-salt-file.")
	fs.Var(&f.labels, "label", "Extra label key=value for every series (comma-separated, repeatable).")
	fs.Var(&f.renames, "rename", "Metric rename old=new (comma-separated, repeatable; default ALERTS=alerts).")
	fs.Var(&f.elideLabels, "elide-label", "Label name removed from every series, after --label and relabel_configs, before anonymization and queueing (repeatable, one name per flag: not comma-split, as in telemeter-client). Default prometheus and prometheus_replica, the external labels of the cluster's Prometheus replicas; giving the flag replaces the default, and --elide-label= alone elides nothing.")
	fs.StringVar(&f.listen, "listen", ":9002", "Address for /metrics, /healthz, /readyz, POST /-/reload (--web.enable-lifecycle) and /federate (the last cycle as sent: the cluster's anonymized telemetry). Every interface by default, for the cluster's Prometheus to scrape: bind localhost:9002, or protect it with --web.config.file.")
	fs.StringVar(&f.listen, "web.listen-address", ":9002", "Alias of --listen.")
	fs.BoolVar(&f.webEnableLifecycle, "web.enable-lifecycle", true, "Serve configuration reload over HTTP (POST or PUT /-/reload on --listen), as telemeter-client does for cluster-monitoring-operator's reload sidecar; false answers 403, as Prometheus does without the flag. SIGHUP reloads regardless.")
	fs.StringVar(&f.webConfig, "web.config.file", "", "Prometheus exporter-toolkit web config for --listen: TLS, client certificates (mTLS), TLS versions and cipher suites, basic auth; certificates are re-read on change. Empty: plain HTTP.")
	fs.StringVar(&f.configFile, "config.file", "", "Optional YAML file: relabel_configs, limits, queue and send settings.")
	fs.StringVar(&f.gatheringURL, "gathering-url", "", "URL of the fleet's gathering definition (e.g. <to>/api/v1/gathering), polled every gathering.interval; it replaces the local selectors, which remain the fallback.")
	fs.StringVar(&f.queueDir, "queue.dir", "data/queue", "Directory of the on-disk queue. If the default cannot be written, $TMPDIR/phonehome-forwarder-queue.")
	fs.TextVar(&f.queueMaxBytes, "queue.max-bytes", 256*units.MiB, "Bound of the on-disk queue, e.g. 256MiB (overrides queue.max_bytes).")
	fs.StringVar(&f.logLevel, "log.level", "info", "debug, info, warn or error.")
	fs.StringVar(&f.logLevel, "log-level", "info", "Alias of --log.level (telemeter-client).")
	fs.BoolVar(&f.verbose, "v", false, "telemeter-client: verbose output, i.e. --log.level=debug unless a level is given.")
	fs.BoolVar(&f.verbose, "verbose", false, "Alias of -v.")
	fs.StringVar(&f.logFormat, "log.format", "json", "json or logfmt.")
	fs.BoolVar(&f.checkConfig, "check-config", false, "Validate flags and configuration, print ok and exit.")
	fs.BoolVar(&f.showVersion, "version", false, "Print the version and exit.")
	fs.BoolVar(&f.disabled, "disabled", false, "Opt out of telemetry: collect and send nothing.")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if f.verbose && !f.set["log.level"] && !f.set["log-level"] {
		f.logLevel = "debug"
	}
	return f, nil
}

// inlineSecrets are telemeter-client's inline secret flags and the file
// flag recommended instead.
var inlineSecrets = []struct{ flag, file string }{
	{"from-token", "from-token-file"},
	{"to-token", "to-token-file"},
	{"anonymize-salt", "anonymize-salt-file"},
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log.level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "logfmt", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log.format %q: want json or logfmt", format)
	}
}

// setup is the validated, compiled configuration.
type setup struct {
	disabledReason string
	from, to       *url.URL
	policy         forward.Policy
	relabel        relabel.Config // the local rules, before a definition adds anonymize_labels
	gatheringURL   string
	file           forward.FileConfig
	fromClient     *http.Client
	toClient       *http.Client
	// protocol is forward.ProtocolRemoteWrite, ProtocolTelemeter, or
	// ProtocolAuto when the /authorize answer decides.
	protocol string
	toUpload string // the telemeter upload URL
}

// defaultCacheFile keeps the gathering definition's cache in queueDir unless
// gathering.cache_file names a file.
func (s *setup) defaultCacheFile(queueDir string) {
	if s.gatheringURL != "" && s.file.Gathering.CacheFile == "" {
		s.file.Gathering.CacheFile = filepath.Join(queueDir, "gathering-definition.json")
	}
}

// load validates every flag and the config file, reporting all problems at once.
func load(f *flags, logger *slog.Logger) (*setup, error) {
	s := &setup{}
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	file, err := forward.LoadFileConfig(f.configFile)
	if err != nil {
		add(fmt.Errorf("--config.file %s: %w", f.configFile, err))
	}
	s.file = file
	if f.set["queue.max-bytes"] {
		s.file.Queue.MaxBytes = f.queueMaxBytes
		if f.queueMaxBytes < 64*units.KiB {
			add(errors.New("--queue.max-bytes: must be at least 64KiB"))
		}
	}

	switch {
	case f.disabled:
		s.disabledReason = "--disabled"
	case f.to == "" && f.toUpload == "" && f.toAuth == "":
		s.disabledReason = "no --to"
	}
	enabled := s.disabledReason == ""
	parseURL := func(name, v string, required bool) *url.URL {
		if v == "" {
			if required {
				add(fmt.Errorf("--%s: required", name))
			}
			return nil
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add(fmt.Errorf("--%s %q: want an http(s) base URL", name, v))
			return nil
		}
		return u
	}
	s.from = parseURL("from", f.from, enabled)
	s.to = parseURL("to", f.to, false)
	if s.from != nil {
		// telemeter-client takes the federate URL itself as well.
		s.from.Path = strings.TrimSuffix(strings.TrimSuffix(s.from.Path, "/"), "/federate")
	}
	if u := parseURL("to-upload", f.toUpload, false); u != nil {
		s.toUpload = u.String()
	} else if s.to != nil {
		u := *s.to
		u.Path = strings.TrimSuffix(u.Path, "/") + "/upload"
		s.toUpload = u.String()
	}
	parseURL("to-auth", f.toAuth, false)
	if f.to == "" && (f.toUpload == "") != (f.toAuth == "") {
		add(errors.New("--to-upload and --to-auth: both are needed without --to"))
	}
	if u := parseURL("gathering-url", f.gatheringURL, false); u != nil {
		s.gatheringURL = u.String()
	}
	if enabled && f.id == "" {
		add(errors.New("--id: required"))
	}
	fleetToken := f.toTokenFile != "" || f.toToken != ""
	switch f.authorize {
	case forward.AuthorizeAuto, forward.AuthorizeNever:
	case forward.AuthorizeAlways:
		if !fleetToken {
			add(errors.New("--authorize=always: needs --to-token-file (the fleet token to exchange)"))
		}
	default:
		add(fmt.Errorf("--authorize %q: want auto, always or never", f.authorize))
	}
	telemeterURLs := f.toUpload != "" || f.toAuth != ""
	switch s.protocol = f.protocol; f.protocol {
	case forward.ProtocolAuto:
		switch {
		case telemeterURLs:
			s.protocol = forward.ProtocolTelemeter
		case !fleetToken || f.authorize == forward.AuthorizeNever:
			s.protocol = forward.ProtocolRemoteWrite // nothing to ask /authorize with
		}
	case forward.ProtocolRemoteWrite:
		if telemeterURLs {
			add(errors.New("--to-upload/--to-auth: telemeter endpoints, not for --to-protocol=remote-write"))
		}
	case forward.ProtocolTelemeter:
	default:
		add(fmt.Errorf("--to-protocol %q: want auto, remote-write or telemeter", f.protocol))
	}
	if s.protocol == forward.ProtocolTelemeter && enabled {
		if !fleetToken {
			add(errors.New("telemeter protocol: needs --to-token-file (the fleet token for /authorize)"))
		}
		if f.authorize == forward.AuthorizeNever {
			add(errors.New("telemeter protocol: needs /authorize, not --authorize=never"))
		}
	}
	switch f.rwVersion {
	case forward.VersionAuto, forward.VersionV1, forward.VersionV2:
	default:
		add(fmt.Errorf("--remote-write.version %q: want auto, 1 or 2", f.rwVersion))
	}
	if f.interval <= 0 {
		add(fmt.Errorf("--interval %s: must be positive", f.interval))
	}
	for _, tf := range []struct{ name, path string }{{"from-token-file", f.fromTokenFile}, {"to-token-file", f.toTokenFile}} {
		if tf.path == "" {
			continue
		}
		if b, err := os.ReadFile(tf.path); err != nil {
			add(fmt.Errorf("--%s: %w", tf.name, err))
		} else if strings.TrimSpace(string(b)) == "" {
			add(fmt.Errorf("--%s %s: empty", tf.name, tf.path))
		}
	}
	fromCert, err := clientCertificate("tls-cert-file", "tls-private-key-file", f.tlsCertFile, f.tlsKeyFile)
	if err != nil {
		add(err)
	}
	toCert, err := clientCertificate("to-cert-file", "to-key-file", f.toCertFile, f.toKeyFile)
	if err != nil {
		add(err)
	}
	if s.fromClient, err = forward.NewHTTPClient(f.fromCAFile, fromCert, logger.With("client", "from")); err != nil {
		add(fmt.Errorf("--from-ca-file: %w", err))
	}
	if s.toClient, err = forward.NewHTTPClient(f.toCAFile, toCert, logger.With("client", "to")); err != nil {
		add(fmt.Errorf("--to-ca-file: %w", err))
	}
	if err := webtls.ValidateWebConfig(f.webConfig, webtls.ServerOptions{BasicAuth: true}); err != nil {
		add(fmt.Errorf("--web.config.file: %w", err))
	}
	if s.fromClient != nil {
		s.fromClient.Timeout = time.Duration(s.file.Federate.Timeout)
		if f.fromToken != "" {
			forward.WithBearerToken(s.fromClient, f.fromToken)
		}
	}
	if f.set["limit-bytes"] {
		if f.limitBytes < 0 {
			add(fmt.Errorf("--limit-bytes %d: must not be negative", f.limitBytes))
		}
		s.file.Federate.MaxBytes = units.Base2Bytes(f.limitBytes)
	}

	// Allowlist: --match, --match-file, then the config file's matches.
	sel := append([]string(nil), f.matches...)
	if f.matchFile != "" {
		if mf, err := os.Open(f.matchFile); err != nil {
			add(fmt.Errorf("--match-file: %w", err))
		} else {
			more, err := allowlist.ReadSelectors(mf)
			_ = mf.Close()
			add(err)
			sel = append(sel, more...)
		}
	}
	sel = append(sel, s.file.Matches...)
	if enabled && len(sel) == 0 && f.gatheringURL == "" {
		add(errors.New("--match/--match-file: at least one selector is required (or --gathering-url)"))
	}
	if s.policy.Allow, err = allowlist.Parse(sel); err != nil {
		add(fmt.Errorf("selectors: %w", err))
	}

	// Relabel rules: the file's, then --elide-label's labeldrop.
	rc := relabel.Config{RelabelConfigs: s.file.RelabelConfigs, Rename: map[string]string{}, ExternalLabels: map[string]string{}}
	if elide, err := elideRule(elidedLabels(f)); err != nil {
		add(err)
	} else if elide != nil {
		rc.RelabelConfigs = append(slices.Clip(rc.RelabelConfigs), elide)
	}
	if enabled {
		rc.ID = f.id
	}
	for _, n := range f.anonymizeLabels {
		if n = strings.TrimSpace(n); n != "" {
			rc.AnonymizeLabels = append(rc.AnonymizeLabels, n)
		}
	}
	rc.AnonymizeLabels = append(rc.AnonymizeLabels, s.file.AnonymizeLabels...)
	if f.salt != "" {
		rc.Salt = []byte(f.salt) // inline wins, as in telemeter-client
	} else if f.saltFile != "" {
		b, err := os.ReadFile(f.saltFile)
		if err != nil {
			add(fmt.Errorf("--anonymize-salt-file: %w", err))
			// The file is the one cause: a stand-in keeps relabel.Parse from
			// reporting the missing salt again as "0 bytes" (errs is not
			// empty, so these rules are never used).
			b = make([]byte, relabel.MinSaltBytes)
		}
		rc.Salt = []byte(strings.TrimRight(string(b), "\r\n"))
	}
	renames := f.renames
	if len(renames) == 0 { // as telemeter-client, also for an empty --rename=
		renames = sliceFlag{"ALERTS=alerts"}
	}
	for _, kv := range renames {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			add(fmt.Errorf("--rename %q: want old=new", kv))
			continue
		}
		rc.Rename[k] = v
	}
	for _, kv := range f.labels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			add(fmt.Errorf("--label %q: want key=value", kv))
			continue
		}
		rc.ExternalLabels[k] = v
	}
	if s.policy.Rules, err = relabel.Parse(rc); err != nil {
		add(fmt.Errorf("relabeling: %w", err))
	}
	s.relabel = rc
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return s, nil
}

func run(args []string, stderr io.Writer) int {
	// SIGHUP reloads. Subscribed first and never unsubscribed: until the
	// reload actor runs (a long queue replay at start) and while the last
	// flush runs at shutdown, a SIGHUP (a config-reloader sidecar) would
	// otherwise kill the process with its default action. One that arrives
	// early waits in the channel and triggers one reload.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	f, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "forwarder: %v\n", err)
		return 2
	}
	if f.showVersion {
		fmt.Fprintln(stderr, version.Print("forwarder"))
		return 0
	}
	logger, err := newLogger(stderr, f.logLevel, f.logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "forwarder: %v\n", err)
		return 2
	}
	s, err := load(f, logger)
	if err != nil && f.checkConfig { // plain text, one problem a line
		fmt.Fprintf(stderr, "forwarder: invalid configuration:\n%v\n", err)
		return 2
	}
	if err != nil {
		logger.Error("invalid configuration", "file", f.configFile, "err", err)
		return 2
	}
	for _, sec := range inlineSecrets {
		if f.set[sec.flag] {
			logger.Warn("a secret was given inline on the command line, where other processes can read it; use the file flag instead",
				"flag", "--"+sec.flag, "instead", "--"+sec.file, "file_flag_ignored", f.set[sec.file])
		}
	}
	if f.checkConfig {
		fmt.Fprintln(stderr, "ok")
		return 0
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
	)

	var (
		fwd         *forward.Forwarder
		authorizer  *forward.Authorizer
		creds       forward.Credentials = forward.TokenFile(f.toTokenFile)
		fromToken                       = f.fromTokenFile
		toTokenFile                     = f.toTokenFile
	)
	if f.toToken != "" { // inline wins, as in telemeter-client
		creds, toTokenFile = forward.StaticToken(f.toToken), ""
	}
	if f.fromToken != "" {
		fromToken = "" // sent by the client itself (forward.WithBearerToken)
	}
	if s.disabledReason == "" && !f.set["queue.dir"] {
		if f.queueDir, err = usableQueueDir(logger, f.queueDir, fallbackQueueDir()); err != nil {
			logger.Error("open queue", "err", err)
			return 1
		}
	}
	s.defaultCacheFile(f.queueDir)
	if s.disabledReason == "" {
		// The pseudonym is what the fleet sees as _id; logging it lets an
		// operator link this cluster's series across a move (docs/migrating-from-telemeter.md).
		logger.Info("cluster pseudonym", "cluster_id", s.policy.Rules.HashedID())
		q, err := forward.OpenQueue(f.queueDir, logger.With("component", "queue"), reg, forward.QueueOptions{
			MaxBytes: int64(s.file.Queue.MaxBytes), SegmentBytes: int64(s.file.Queue.SegmentBytes),
		})
		if err != nil {
			logger.Error("open queue", "dir", f.queueDir, "err", err)
			return 1
		}
		defer func() {
			if err := q.Close(); err != nil {
				logger.Error("close queue", "err", err)
			}
		}()
		src := forward.NewFederator(s.from, s.fromClient, forward.FederateOptions{
			Matches: s.policy.Allow.Selectors(), TokenFile: fromToken,
			MaxBytes: int64(s.file.Federate.MaxBytes), UserAgent: userAgent,
		})
		// Authorize: for remote-write as --authorize says; for telemeter
		// (and auto, which the answer decides) at the telemeter URL with
		// the hashed id in the query, as telemeter-client sends it.
		authMode, authBase, authURL := f.authorize, s.to, ""
		if s.protocol != forward.ProtocolRemoteWrite {
			if s.protocol == forward.ProtocolTelemeter {
				authMode = forward.AuthorizeAlways // a telemeter-server always has /authorize
			}
			authURL, err = forward.TelemeterAuthorizeURL(s.to, f.toAuth, s.policy.Rules.HashedID())
			if err != nil {
				logger.Error("authorize URL", "err", err) // validated by load
				return 2
			}
			if authBase == nil {
				authBase, _ = url.Parse(authURL)
			}
		}
		if s.protocol != forward.ProtocolRemoteWrite || (f.authorize != forward.AuthorizeNever && f.toTokenFile+f.toToken != "") {
			ac := s.file.Authorize
			authorizer = forward.NewAuthorizer(logger.With("component", "authorize"), reg, authBase, s.toClient, forward.AuthorizerOptions{
				Mode: authMode, TokenFile: toTokenFile, Token: f.toToken, URL: authURL,
				ClusterID: s.policy.Rules.HashedID(), // never the raw id
				RenewAt:   ac.RenewAt, Jitter: forward.JitterOption(ac.Jitter),
				MinBackoff: time.Duration(ac.MinBackoff), MaxBackoff: time.Duration(ac.MaxBackoff),
				Timeout: time.Duration(ac.Timeout), UserAgent: userAgent,
			})
			creds = authorizer
		}
		po := forward.ProtocolSenderOptions{
			Protocol: s.protocol, Authorizer: authorizer,
			Logger: logger.With("component", "deliver"), Registerer: reg,
		}
		if s.to != nil && s.protocol != forward.ProtocolTelemeter {
			po.RemoteWrite = forward.NewHTTPSender(s.to, s.toClient, forward.HTTPSenderOptions{
				Credentials: creds, UserAgent: userAgent, Timeout: time.Duration(s.file.Send.Timeout),
				Version:   f.rwVersion,
				StateFile: filepath.Join(f.queueDir, "remote-write-version.json"),
				Logger:    logger.With("component", "remote_write"), Registerer: reg,
			})
		}
		if s.protocol != forward.ProtocolRemoteWrite {
			po.Telemeter = forward.NewTelemeterSender(s.toUpload, s.toClient, authorizer, forward.TelemeterSenderOptions{
				UserAgent: userAgent, Timeout: time.Duration(s.file.Send.Timeout), Registerer: reg,
			})
		}
		sender := forward.NewProtocolSender(po)
		initial := s.policy
		if s.gatheringURL != "" {
			initial.DefinitionVersion = "local"
			if initial.Allow.Len() == 0 {
				initial = forward.Policy{} // nothing runs until a definition arrives
			}
		}
		fwd = forward.New(logger.With("component", "forward"), reg, src, initial, q, sender, forward.Options{
			Interval:             f.interval,
			MaxSeries:            s.file.Federate.MaxSeries,
			SeriesCacheSize:      s.file.Federate.SeriesCacheSize(),
			MaxSamplesPerRequest: s.file.Send.MaxSamplesPerRequest,
			MinBackoff:           time.Duration(s.file.Send.MinBackoff),
			MaxBackoff:           time.Duration(s.file.Send.MaxBackoff),
			FlushTimeout:         time.Duration(s.file.Send.FlushTimeout),
		})
	} else {
		logger.Info("telemetry disabled, nothing will be collected or sent", "reason", s.disabledReason)
	}
	reloader := newReloader(logger.With("component", "config"), reg, f, s, fwd)
	var poller *gathering.Poller
	if fwd != nil && s.gatheringURL != "" {
		gc := s.file.Gathering
		poller = gathering.NewPoller(logger.With("component", "gathering"), reg, gathering.PollerOptions{
			URL: s.gatheringURL, Client: s.toClient, Credentials: creds,
			Interval: time.Duration(gc.Interval), Jitter: forward.JitterOption(gc.Jitter), Timeout: time.Duration(gc.Timeout),
			CacheFile: gc.CacheFile, UserAgent: userAgent, ForwarderVersion: forwarderVersion,
			Apply: reloader.applyDefinition, // over the local relabel rules in force
		})
		reloader.poller = poller
		// At start: the cached definition, else the local selectors, else wait.
		if c, err := poller.LoadCache(); err == nil {
			logger.Info("using the cached gathering definition until the next poll", "version", c.Def.Version, "file", gc.CacheFile)
		} else if s.policy.Allow.Len() > 0 {
			poller.UseLocal()
			logger.Info("no cached gathering definition, using the local selectors until the next poll", "reason", err.Error())
		} else {
			logger.Warn("no cached gathering definition and no local selectors: collecting nothing until a definition arrives", "reason", err.Error())
		}
	}

	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		logger.Error("listen", "addr", f.listen, "err", err)
		return 1
	}
	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	readyz := func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}
	mux.HandleFunc("GET /readyz", readyz)
	mux.HandleFunc("GET /healthz/ready", readyz) // telemeter-client's path, for probes written for it
	mux.Handle("POST /-/reload", reloader.handler(f.webEnableLifecycle))
	mux.Handle("PUT /-/reload", reloader.handler(f.webEnableLifecycle))
	if fwd != nil { // telemeter-client's /federate: what the last cycle sent, as it left
		mux.Handle("GET /federate", fwd.LastCycleHandler())
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	var g oklogrun.Group
	g.Add(shutdown.Signals()) // before the server says it listens: no signal is lost
	{                         // HTTP server for self-metrics and health.
		g.Add(func() error {
			logger.Info("listening", "addr", ln.Addr().String())
			if fwd == nil {
				ready.Store(true) // disabled: nothing to wait for
			}
			if err := webtls.Serve(ln, srv, f.webConfig, logger.With("component", "web")); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve http: %w", err)
			}
			return nil
		}, func(error) {
			ready.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
	}
	{ // Configuration reload on SIGHUP (POST /-/reload is served above).
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return reloader.run(ctx, hup) }, func(error) { cancel() })
	}
	if authorizer != nil { // Cluster credential: exchange at start, renew before expiry.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return authorizer.Run(ctx) }, func(error) { cancel() })
	}
	if poller != nil { // Gathering definition: poll at once, then every gathering.interval ± jitter.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return poller.Run(ctx) }, func(error) { cancel() })
	}
	if fwd != nil { // Collection and delivery; returns after a bounded last flush.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error {
			ready.Store(true)
			return fwd.Run(ctx)
		}, func(error) {
			ready.Store(false)
			cancel()
		})
	}

	if err := g.Run(); err != nil && !errors.Is(err, oklogrun.ErrSignal) {
		logger.Error("forwarder stopped", "err", err)
		return 1
	}
	logger.Info("forwarder stopped")
	return 0
}

// clientCertificate loads the client certificate named by the flags
// certFlag and keyFlag (both or neither; nil when neither): a bad pair
// fails at start, a rotated one is re-read (webtls.ClientCertificate).
func clientCertificate(certFlag, keyFlag, certFile, keyFile string) (func(*tls.CertificateRequestInfo) (*tls.Certificate, error), error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, fmt.Errorf("--%s and --%s: give both or neither", certFlag, keyFlag)
	}
	get, err := webtls.ClientCertificate(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--%s/--%s: %w", certFlag, keyFlag, err)
	}
	return get, nil
}
