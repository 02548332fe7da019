// Command receiver is phonehome's fleet receiver: authenticated remote-write
// ingest into per-tenant TSDBs, blocks shipped to object storage, and the
// Prometheus HTTP API over them. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync/atomic"
	"time"

	oklogrun "github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"golang.org/x/net/netutil"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/erasure"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/gcburst"
	"github.com/phonehome/phonehome/internal/buildversion"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/peers"
	"github.com/phonehome/phonehome/push"
	"github.com/phonehome/phonehome/pushdown"
	"github.com/phonehome/phonehome/query"
	"github.com/phonehome/phonehome/receive"
	"github.com/phonehome/phonehome/relabel"
	"github.com/phonehome/phonehome/rules"
	"github.com/phonehome/phonehome/shutdown"
	"github.com/phonehome/phonehome/status"
	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
	"github.com/phonehome/phonehome/storage/lifecycle"
	"github.com/phonehome/phonehome/upstream"
	"github.com/phonehome/phonehome/webtls"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func init() { buildversion.Set() } // --version, build_info and the buildinfo API

// bucketListGrace bounds how long readiness waits for the first listing of
// the bucket: an unreachable bucket must not keep ingest away for longer.
const bucketListGrace = 30 * time.Second

// defaultGOGC is the receiver's GC target. A fleet receiver is bound by
// memory per active series more than by samples/s. Since ingestion stopped
// producing garbage (decode_v1.go), the RSS is the live heap and GOGC barely
// moves it (bench/results/README.md, "GC settings"). With head labels in a
// symbol table (dedupelabels) the heap lost its pointer-free label bytes, and
// at GOGC=50 a 5M-series catch-up spent 17 % more CPU collecting: 70 brought
// that back with the same RSS per series at 200k and at 5M.
const defaultGOGC = 70

// defaultTenant is the tenant of every request under --insecure.no-auth.
const defaultTenant = "default"

func run(args []string, stderr io.Writer) (code int) {
	if len(args) > 0 && args[0] == "erase" { // offline erasure (erase.go)
		return runErase(args[1:], stderr)
	}
	fs := flag.NewFlagSet("receiver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: receiver [flags]\n       receiver erase [flags]   erase a cluster's data offline (receiver erase --help)\n\nFlags:")
		fs.PrintDefaults()
	}
	var (
		configFile       = fs.String("config.file", "", "Path to the YAML configuration file. Empty means all defaults.")
		listenAddr       = fs.String("web.listen-address", ":9291", "Address to listen on for the API, ingest and telemetry.")
		webConfig        = fs.String("web.config.file", "", "Prometheus exporter-toolkit web config: TLS, client certificates (mTLS), TLS versions and cipher suites; certificates are re-read on change. Empty: plain HTTP. Bearer-token authentication applies on top.")
		storagePath      = fs.String("storage.path", "data", "Directory for the per-tenant TSDBs and, by default, the filesystem bucket.")
		logLevel         = fs.String("log.level", "info", "Log level: debug, info, warn or error.")
		logFormat        = fs.String("log.format", "json", "Log format: json or logfmt.")
		checkOnly        = fs.Bool("check-config", false, "Validate the configuration (and the files it names), print ok and exit.")
		noAuth           = fs.Bool("insecure.no-auth", false, "INSECURE: accept every request without credentials, as tenant \""+defaultTenant+"\". For local trials only.")
		showVersion      = fs.Bool("version", false, "Print the version and exit.")
		maxConns         = fs.Int("web.max-connections", 0, "Maximum simultaneous connections, as Prometheus' flag (whose default is 512): more wait to be accepted. Every forwarder and Prometheus of the fleet may keep one open, so size it above the fleet's clients; 0 = unlimited.")
		maxInflight      = fs.Int("receive.max-inflight-requests", 1024, "Write requests read, decoded and written at once across all tenants and clusters (one cluster's: limits.max_inflight_requests_per_cluster); more are answered 503 with Retry-After before their body is read, which bounds the memory of decoding. 0 = unlimited.")
		maxInflightBytes = fs.Int64("receive.max-inflight-bytes", 1<<30, "Memory the write requests in flight may hold at once across all tenants and clusters, in bytes: bodies, decoded bytes and decoded structures, reserved as they are read and decoded (an ordinary write holds a few MB, a crafted one up to ~2 GiB). A write that would pass it while others hold memory waits its turn, first come first served, for up to 5s, then is answered 503 with Retry-After; one alone is always served. Size it to what the pod's memory limit leaves above the head (docs/operations.md). 0 = unlimited.")
		queryTimeout     = fs.Duration("query.timeout", query.DefaultTimeout, "Maximum time a PromQL query may take before it is aborted, as Prometheus' flag: queries of the API (whose timeout parameter can only shorten it), of the fleet rules and of the status page.")
		readTimeout      = fs.Duration("web.read-timeout", 5*time.Minute, "Maximum duration to read a request, body included, as Prometheus' flag: a client that trickles its body does not hold a connection and its buffer longer.")
		enablePprof      = fs.Bool("web.enable-pprof", false, "Serve net/http/pprof under /debug/pprof/ (unauthenticated: for benchmarks and debugging on trusted networks only).")
		gcPercent        = fs.Int("runtime.gogc", defaultGOGC, "GOGC for the process (100 is Go's default; see bench/results/README.md, \"GC settings\"). An explicit GOGC environment variable overrides the default, not an explicit flag.")
		memLimit         = fs.Int64("runtime.memory-limit-bytes", 0, "Soft memory limit for the Go runtime (GOMEMLIMIT) in bytes; 0 keeps the GOMEMLIMIT environment variable or no limit.")
		burstGC          = fs.Int("runtime.compaction-gogc", gcburst.DefaultPercent, "GOGC while a block is written (the head flush at shutdown and at an erasure; the head cut every block range, erasure rewrites and bucket compactions only while the heap is quiet, not during a catch-up): the garbage of a head cut, ~900 B per head series, would otherwise grow the heap to the --runtime.gogc goal, ~1.7x the live heap, which the pod's memory limit must cover (docs/operations.md). Lower is a lower peak for more GC work while the block is written; 0 leaves --runtime.gogc in force.")
		releaseFree      = fs.Duration("runtime.release-free-heap-interval", 10*time.Second, "How often to check whether a burst (series creation, head compaction) left free heap that the Go runtime keeps mapped, and return it to the OS when it exceeds 5% of the live heap (at least 8MiB) and less than 5% of the heap was allocated since the last check (docs/operations.md); 0 leaves it to the runtime.")
	)
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "receiver: unexpected arguments: %v\n", fs.Args())
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stderr, version.Print("receiver"))
		return 0
	}
	if *queryTimeout <= 0 {
		fmt.Fprintf(stderr, "receiver: --query.timeout %s: want a positive duration\n", *queryTimeout)
		return 2
	}
	gogcFlag := false
	fs.Visit(func(f *flag.Flag) { gogcFlag = gogcFlag || f.Name == "runtime.gogc" })
	if gogcFlag || os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gcPercent)
	}
	if *memLimit > 0 {
		debug.SetMemoryLimit(*memLimit)
	}
	gcburst.SetPercent(*burstGC)
	logger, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "receiver: %v\n", err)
		return 2
	}
	// badConfig reports a bad configuration and returns 2: as a log line,
	// or under --check-config as plain text, one problem a line.
	badConfig := func(file string, err error) int {
		if *checkOnly {
			fmt.Fprintf(stderr, "receiver: invalid configuration:\n%v\n", err)
			return 2
		}
		logger.Error("invalid configuration", "file", file, "err", err)
		return 2
	}
	cfg, err := receive.LoadConfig(*configFile)
	if err != nil {
		return badConfig(*configFile, err)
	}
	reg := prometheus.NewRegistry()
	gcburst.RegisterMetrics(reg)
	a, err := setupAuth(logger.With("component", "auth"), reg, cfg.Auth, *noAuth)
	if err != nil {
		return badConfig(*configFile, err)
	}
	if err := rules.CheckFiles(cfg.Rules); err != nil {
		return badConfig(*configFile, err)
	}
	if err := cfg.Gathering.CheckFiles(); err != nil {
		return badConfig(*configFile, err)
	}
	if err := webtls.ValidateWebConfig(*webConfig, webtls.ServerOptions{}); err != nil {
		return badConfig(*webConfig, err)
	}
	warnAuth(logger, a, cfg.Auth) // at --check-config too
	receive.WarnUnrenamedAlerts(logger.With("component", "config"), cfg)
	if *checkOnly {
		fmt.Fprintln(stderr, "ok")
		return 0
	}
	if *noAuth {
		logger.Warn("authentication is DISABLED (--insecure.no-auth): anyone who can reach this port can write and read", "tenant", defaultTenant)
	}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versioncollector.NewCollector("phonehome_receiver"),
	)

	ln, err := net.Listen("tcp", *listenAddr)
	if err != nil {
		logger.Error("listen", "addr", *listenAddr, "err", err)
		return 1
	}
	defer ln.Close()
	if *maxConns > 0 {
		ln = netutil.LimitListener(ln, *maxConns)
	}

	db, err := storage.Open(logger.With("component", "storage"), reg, *storagePath, cfg.Storage)
	if err != nil {
		logger.Error("open storage", "path", *storagePath, "err", err)
		return 1
	}
	// No tenant ships a block until the erasure jobs on disk are known: a
	// start that fails before then flushes the heads at Close, and a job
	// cut short after its head flush left blocks that still hold its
	// cluster (tombstoned, not rewritten).
	db.HoldShipping(func(string) bool { return true })
	defer func() { code = closeStorage(logger, db, code) }() // after the closes deferred below: the flush, the upload, the last line

	bstore, err := bucketstore.Open(logger.With("component", "bucketstore"), reg, *storagePath, cfg.Storage.Bucket, cfg.BucketStore)
	if err != nil {
		logger.Error("open bucket store", "err", err)
		return 1
	}
	defer func() { _ = bstore.Close() }() // nil when disabled; Close is nil-safe
	lc, err := lifecycle.Open(logger.With("component", "lifecycle"), reg, *storagePath, cfg.Storage, cfg.Compactor)
	if err != nil {
		logger.Error("open bucket lifecycle", "err", err)
		return 1
	}
	defer func() { _ = lc.Close() }()
	var afterErase func(context.Context) error // drops the cache's copies of rewritten blocks
	if bstore != nil {
		afterErase = bstore.Sync
	}
	pushes, err := push.Open(logger.With("component", "push"), reg, filepath.Join(*storagePath, "push"), db, cfg.Push,
		push.Options{Replica: cfg.Storage.ExternalLabels["replica"], Denied: db.Denied}) // replicas' partial sums apart (push_replica)
	if err != nil {
		logger.Error("open push state", "err", err)
		return 1
	}
	defer func() { _ = pushes.Close() }() // after Run has returned
	eraser, err := erasure.New(logger.With("component", "erasure"), reg, db, lc, filepath.Join(*storagePath, erasureDir),
		erasure.Options{AfterBucket: afterErase, Pushes: pushes})
	if err != nil {
		logger.Error("open erasure jobs", "err", err)
		return 1
	}
	// A tenant's blocks are not shipped while one of its jobs has not
	// erased the local storage.
	db.HoldShipping(eraser.ShippingHeld)
	// Fleet view: local data, the bucket and the peers' heads (remote read).
	// Validated with the config; the CA bundle and the client certificate
	// are re-read when they change.
	peerTransport, err := cfg.Peers.TLSConfig.NewRoundTripper(logger.With("component", "peers"))
	if err != nil {
		logger.Error("invalid configuration", "file", *configFile, "err", fmt.Errorf("peers.tls_config: %w", err))
		return 2
	}
	var bucketSynced func(time.Time) bool // what peers may leave to the bucket: nothing without a bucket store
	if bstore != nil {
		bucketSynced = bstore.SyncedSince
	}
	peerSet, err := peers.New(logger.With("component", "peers"), reg, cfg.Peers, peers.Options{
		HTTPClient: &http.Client{Transport: peerTransport}, BucketSynced: bucketSynced,
	})
	if err != nil {
		return badConfig(*configFile, err)
	}
	reader := peerSet.NewReader(bucketstore.NewReader(db, bstore))

	var ready atomic.Bool
	// Ready once the bucket has been listed (or tried, for up to
	// bucketListGrace): reads until then warn that the bucket's data is missing.
	started := time.Now()
	isReady := func() bool {
		return ready.Load() && db.Ready() && (bstore.Attempted() || time.Since(started) > bucketListGrace)
	}
	policy, err := receive.NewPolicy(cfg)
	if err != nil {
		return badConfig(*configFile, err)
	}
	limiter := limits.New(reg, cfg.Limits, nil)
	limiter.TrackClusters(receive.Reasons()) // per-cluster state for the status page (status/)
	// The status page's clusters as the previous process left them, so
	// that those which did not come back show as silent; erased ones stay out.
	clusterState := openStatusClusters(logger, reg, limiter, *storagePath, db.Denied)
	eraser.SetLimiter(forgetting{limiter, clusterState}) // an erased cluster's series budget and status-page entry go with its data
	var sink storage.Writer = db
	var up *upstream.Writer // forward mode: validated writes also (or only) go upstream
	if cfg.Upstream.Enabled() {
		up, err = upstream.New(logger.With("component", "upstream"), reg, db, filepath.Join(*storagePath, "upstream"), cfg.Upstream)
		if err != nil {
			logger.Error("open upstream queue", "err", err)
			return 1
		}
		defer func() { _ = up.Close() }() // after Run has returned
		sink = up
	}
	writes := receive.NewHandler(logger.With("component", "receive"), reg, sink, limiter, receive.Options{
		Policy:             policy,
		Ready:              isReady,
		OverwriteClusterID: cfg.Auth.IDMismatch == receive.IDMismatchOverwrite,
		AcceptedMessages:   cfg.RemoteWrite.AcceptedProtobufMessages,
		Telemeter:          cfg.Telemeter.Options(),
		Denied:             db.Denied,
		MaxInflight:        *maxInflight,
		MaxInflightBytes:   *maxInflightBytes,
	})
	// The gathering definitions (per tenant), served and enforced with the
	// config's policy; each one's previous versions are kept under the
	// storage path, so the grace period survives a restart — also that of
	// definitions removed from the configuration, the whole section
	// included.
	var (
		policies *receive.PolicyUpdater
		defs     *gathering.Server
	)
	if gatheringState := filepath.Join(*storagePath, "gathering"); cfg.Gathering.Enabled() || gathering.HasState(gatheringState) {
		defs, err = gathering.NewServer(logger.With("component", "gathering"), reg, cfg.Gathering.Files(), gathering.ServerOptions{
			GracePeriod: time.Duration(cfg.Gathering.GracePeriod),
			OnChange:    func() { policies.GatheringChanged() }, // called by defs.Reload (its Run, POST /-/reload), once policies is set
			StateDir:    gatheringState,
		})
		if err != nil {
			return badConfig(*configFile, fmt.Errorf("gathering: %w", err))
		}
		policies = receive.NewPolicyUpdater(writes, policy, defs)
	} else {
		policies = receive.NewPolicyUpdater(writes, policy, nil)
	}
	engine := query.NewEngine(logger.With("component", "query"), reg, query.Options{Timeout: *queryTimeout})
	// Queries and rules over the fleet: parts pushed down to the replicas
	// where that is exact (pushdown), the rest over the merged view.
	var fleetEngine promql.QueryEngine = engine
	if peerSet.Enabled() && cfg.Peers.PushdownEnabled() {
		fleetEngine = pushdown.New(logger.With("component", "pushdown"), reg, engine, pushdown.Options{
			ClusterLabel: relabel.IDLabel,
			Timeout:      *queryTimeout,
			Local:        query.NewQueryable(db),
			Peers:        peerSet.Shards,
			InBucket: func(ctx context.Context, mint, maxt int64) bool {
				id, _ := auth.FromContext(ctx)
				return bstore != nil && (!bstore.Listed() || len(bstore.Blocks(id.Tenant, mint, maxt)) > 0)
			},
		})
	}
	ruler, err := rules.New(logger.With("component", "rules"), reg, fleetEngine, db, cfg.Rules, rules.Options{
		Reader: reader, Tenants: []func() []string{bstore.Tenants, peerSet.Tenants},
	})
	if err != nil {
		return badConfig(*configFile, err)
	}
	localMeta := query.LocalMetadata(db)
	api := query.NewHandler(logger.With("component", "query"), fleetEngine, reader, query.Options{
		Timeout: *queryTimeout, // the engine's: the ceiling of the API's timeout parameter, as in Prometheus
		Ready:   isReady, Version: version.Version, Revision: version.GetRevision(),
		Rules: ruler.RulesRetriever, Alertmanagers: ruler.AlertmanagerRetriever,
		Metadata: peerSet.Metadata(localMeta), // this receiver's and its peers'
	})
	fleet := status.New(logger.With("component", "status"), reg, status.Options{
		Limiter: limiter, Reader: reader, Engine: engine, Gatherer: reg, Tenants: db.Tenants,
		HistoryFile: filepath.Join(*storagePath, "status", "history.json"),
		Definition: func(tenant string) string {
			if defs == nil { // no gathering definitions configured
				return ""
			}
			if c := defs.Current(tenant); c != nil {
				return c.Def.Version
			}
			return ""
		},
	})

	// What SIGHUP reloads, and POST /-/reload: every file applied without
	// a restart. Each is also re-read on its own interval (actors below).
	var (
		reloader *receive.ConfigReloader
		reloads  []func() error
	)
	if *configFile != "" { // limits and the server-side policy
		reloader = receive.NewConfigReloader(logger.With("component", "config"), reg, *configFile, func(c *receive.Config) {
			p, err := receive.NewPolicy(c)
			if err != nil { // LoadConfig validated it; cannot happen
				logger.Error("compile policy", "err", err)
				return
			}
			limiter.Reload(c.Limits)
			policies.SetBase(p)
		})
		reloads = append(reloads, reloader.Reload)
	}
	if defs != nil {
		reloads = append(reloads, defs.Reload)
	}
	authFiles := a.reloadingFiles(logger, cfg.Auth) // the tokens file, the keys file
	for _, f := range authFiles {
		reloads = append(reloads, f.Reload)
	}
	if cfg.Rules.Evaluates() {
		reloads = append(reloads, ruler.Reload)
	}
	// The peers' token files: read by a replica that reads from peers, and
	// the replica token also by one that only answers them (its peer API
	// accepts it), which must drop a token rotated out of the file too.
	peerTokens := peerSet.Enabled() || cfg.Peers.ReplicaTokenFile != ""
	if peerTokens {
		reloads = append(reloads, peerSet.ReloadTokens)
	}

	mux := newRouter() // a method a path is not routed for is 405 before authentication
	mux.Handle("POST /api/v1/write", auth.Middleware(a.authn, auth.PermWrite, writes.CountUnauthenticated, writes))
	mux.Handle("/api/v1/", auth.Middleware(a.authn, auth.PermRead, nil, api))
	var repeater *erasure.Repeater // erasures and re-admissions repeated on the peers, retried on those that miss one
	if peerSet.Enabled() {
		repeater = erasure.NewRepeater(logger.With("component", "erasure"), reg, peerSet)
	}
	admin := auth.Middleware(a.authn, auth.PermAdmin, nil, peerSet.Repeatable(eraser.Handler(repeater)))
	for _, p := range erasure.Patterns {
		mux.Handle(p, admin)
	}
	mux.Handle("/api/v1/admin/", admin) // the rest: authenticated, then 404
	for _, p := range status.Patterns { // fleet status API: read (own tenant) or admin (any), checked by status
		mux.Handle(p, auth.Middleware(a.authn, 0, nil, fleet.Handler()))
	}
	for _, p := range status.UIPatterns { // the status page: static, holds no data
		mux.Handle(p, fleet.UI())
	}
	mux.Handle("POST /api/v1/read", auth.Middleware(peerSet.Authenticator(a.authn), auth.PermRead, nil,
		peerSet.Handler(logger.With("component", "remote_read"), reg, reader, db, db.PeerHorizon, query.ReadOptions{Ready: isReady})))
	mux.Handle("GET "+peers.MetadataPath, auth.Middleware(peerSet.Authenticator(a.authn), auth.PermRead, nil,
		peerSet.MetadataHandler(api, localMeta, isReady)))
	indexCalls := auth.Middleware(peerSet.Authenticator(a.authn), auth.PermRead, nil, // a peer's: its own index, not its samples
		peerSet.IndexHandler(logger.With("component", "query"), api, db, isReady))
	for _, p := range query.IndexPaths() {
		mux.Handle(p, indexCalls)
	}
	mux.Handle("POST "+pushdown.Path, auth.Middleware(peerSet.Authenticator(a.authn), auth.PermRead, nil,
		peerSet.WithInstance(pushdown.NewHandler(logger.With("component", "pushdown"), engine, query.NewQueryable(db), relabel.IDLabel, isReady))))
	if a.authorize != nil {
		a.authorize.Erased = erasedRefusal(db)
		mux.Handle("POST /authorize", a.authorize)
	}
	// Telemeter's two paths, so existing clusters send unchanged: telemeter-client's
	// upload (after /authorize) and Prometheus' telemetry remote-write.
	mux.Handle("POST /upload", auth.Middleware(a.authn, auth.PermWrite, writes.CountUnauthenticated, http.HandlerFunc(writes.ServeUpload)))
	mux.Handle("POST /metrics/v1/receive", auth.Middleware(a.telemeter, auth.PermWrite, writes.CountUnauthenticated, http.HandlerFunc(writes.ServeTelemeterWrite)))
	if defs != nil { // any credential of a tenant may read it, cluster credentials included
		mux.Handle("GET /api/v1/gathering", auth.Middleware(a.authn, 0, nil, defs))
	}
	for _, p := range push.Patterns {
		mux.Handle(p, auth.Middleware(a.authn, auth.PermPush, pushes.CountUnauthenticated, pushes))
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if *enablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	healthy := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "healthy") }
	// The instance header lets a replica that lists itself among its peers
	// recognise itself at its first health check of them (peers/health.go).
	readyz := peerSet.WithInstance(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !isReady() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	}))
	reload := auth.Middleware(a.authn, auth.PermAdmin, nil, reloadHandler(reloads))
	mux.Handle("POST /-/reload", reload) // as Prometheus' (PUT too), but always authenticated
	mux.Handle("PUT /-/reload", reload)
	mux.HandleFunc("GET /-/healthy", healthy)
	mux.Handle("GET /-/ready", readyz)
	// telemeter-server's probes, so a route or load balancer set up for it
	// keeps working.
	mux.HandleFunc("GET /healthz", healthy)
	mux.Handle("GET /healthz/ready", readyz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: *readTimeout, IdleTimeout: 2 * time.Minute}

	var g oklogrun.Group
	g.Add(shutdown.Signals()) // before the server says it listens: no signal is lost
	{                         // HTTP server.
		g.Add(func() error {
			// labels: the build tag decides the memory per series (Makefile).
			logger.Info("listening", "addr", ln.Addr().String(), "labels", labels.ImplementationName)
			ready.Store(true)
			if err := webtls.Serve(ln, srv, *webConfig, logger.With("component", "web")); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve http: %w", err)
			}
			return nil
		}, func(error) {
			ready.Store(false) // unready first, so load balancers move away
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				// Requests still running after 15s (a long remote read) would
				// hold their queriers, and with them the head's flush below.
				logger.Warn("closing connections of requests still running", "err", err)
				_ = srv.Close()
			}
		})
	}
	for _, f := range authFiles { // Tokens and keys file reload: revocation and key rotation without restart.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return f.Run(ctx, time.Duration(cfg.Auth.ReloadInterval)) }, func(error) { cancel() })
	}
	{ // SIGHUP: every reload POST /-/reload runs.
		g.Add(reloadOnSIGHUP(reloads))
	}
	{ // Push aggregation: periodic write of the aggregated state into storage.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return pushes.Run(ctx) }, func(error) { cancel() })
	}
	{ // Status page history: each tenant's totals every minute.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return fleet.Run(ctx) }, func(error) { cancel() })
	}
	{ // Status page clusters: saved every 10 minutes and at shutdown.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return clusterState.Run(ctx) }, func(error) { cancel() })
	}
	if *releaseFree > 0 { // Free heap back to the OS after bursts (memrelease.go).
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return releaseFreeHeap(ctx, logger, *releaseFree) }, func(error) { cancel() })
	}
	if *burstGC > 0 { // Head cuts lower GOGC only while the heap is quiet (gcburst).
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return gcburst.Watch(ctx, 10*time.Second) }, func(error) { cancel() })
	}
	{ // Idle series stop counting towards the series limits.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return limiter.Run(ctx) }, func(error) { cancel() })
	}
	if reloader != nil { // Hot reload of limits and the server-side policy (every 30s; SIGHUP and POST /-/reload above).
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return reloader.Run(ctx, 30*time.Second) }, func(error) { cancel() })
	}
	if defs != nil { // Gathering definition file reload (every reload_interval; SIGHUP and POST /-/reload above).
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return defs.Run(ctx, time.Duration(cfg.Gathering.ReloadInterval)) }, func(error) { cancel() })
	}
	{ // Fleet rules: per-tenant evaluation, rule file reload (every reload_interval; SIGHUP and POST /-/reload above), alerts to Alertmanager.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return ruler.Run(ctx) }, func(error) { cancel() })
	}
	if up != nil { // Upstream delivery of the forward queue.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return up.Run(ctx) }, func(error) { cancel() })
	}
	if peerTokens { // Peer discovery (DNS, with endpoints), token file reload and health checks.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return peerSet.Run(ctx) }, func(error) { cancel() })
	}
	if bstore != nil { // Bucket metadata sync, so queries read every replica's blocks.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return bstore.Run(ctx) }, func(error) { cancel() })
	}
	{ // Erasure jobs (admin API), one at a time, failed ones retried.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return eraser.Run(ctx) }, func(error) { cancel() })
	}
	if repeater != nil { // Retries of erasures and re-admissions on the peers that missed them.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return repeater.Run(ctx) }, func(error) { cancel() })
	}
	if lc.Active() { // Bucket lifecycle: retention, then deletion of marked blocks after the delay.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return lc.Run(ctx) }, func(error) { cancel() })
	}
	{ // Block shipper.
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return db.RunShipper(ctx) }, func(error) { cancel() })
	}

	if err := g.Run(); err != nil && !errors.Is(err, oklogrun.ErrSignal) {
		logger.Error("receiver stopped", "err", err)
		return 1
	}
	logger.Info("receiver stopping: flushing and uploading the head")
	return 0
}

// parseExit is the exit code after a failed flag parse: 0 for --help, as
// the forwarder's, 2 for a bad flag.
func parseExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log.level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "logfmt":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log.format %q: want json or logfmt", format)
	}
}
