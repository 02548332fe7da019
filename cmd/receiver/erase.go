package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/phonehome/phonehome/erasure"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/push"
	"github.com/phonehome/phonehome/receive"
	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
	"github.com/phonehome/phonehome/storage/lifecycle"
)

// erasureDir holds erasure jobs under --storage.path while they run.
const erasureDir = "erasure"

// runErase is `receiver erase`: the erasure of POST /api/v1/admin/erase,
// offline, on a stopped receiver's storage path (the TSDB lock refuses a
// running one). It also resumes the unfinished jobs found there, prints the
// final status as JSON and exits 0, 1 on failure (rerun to resume) or 2 on
// bad flags.
func runErase(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("receiver erase", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configFile  = fs.String("config.file", "", "Path to the receiver's YAML configuration (its storage and bucket).")
		storagePath = fs.String("storage.path", "data", "The receiver's storage path.")
		logLevel    = fs.String("log.level", "info", "Log level: debug, info, warn or error.")
		logFormat   = fs.String("log.format", "json", "Log format: json or logfmt.")
		tenant      = fs.String("tenant", "", "Tenant whose data is erased (required).")
		clusterID   = fs.String("cluster-id", "", "The cluster's _id (its pseudonym) whose series are erased.")
		selector    = fs.String("selector", "", "Instead of --cluster-id: a series selector, e.g. '{_id=\"...\",job=\"x\"}'.")
		noDeny      = fs.Bool("no-deny", false, "Do not refuse the cluster's later writes.")
		readmit     = fs.Bool("readmit", false, "Re-admit --cluster-id (lift its deny list entry) instead of erasing.")
		requestedBy = fs.String("requested-by", "", "Who asked, for the audit event (a ticket, a person).")
	)
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	logger, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "receiver erase: %v\n", err)
		return 2
	}
	badTarget := (*clusterID == "") == (*selector == "")
	if *readmit {
		badTarget = *clusterID == "" || *selector != ""
	}
	if *tenant == "" || badTarget {
		fmt.Fprintln(stderr, "receiver erase: --tenant and exactly one of --cluster-id and --selector are required (--readmit needs --cluster-id)")
		return 2
	}
	cfg, err := receive.LoadConfig(*configFile)
	if err != nil {
		logger.Error("invalid configuration", "file", *configFile, "err", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg := prometheus.NewRegistry()

	// Nothing is flushed or uploaded here beyond what the erasure does;
	// the next start of the receiver ships the rewritten local blocks.
	scfg := cfg.Storage
	no := false
	scfg.UploadOnShutdown, scfg.FlushOnShutdown = &no, &no
	db, err := storage.Open(logger.With("component", "storage"), reg, *storagePath, scfg)
	if err != nil {
		logger.Error("open storage (is the receiver still running?)", "path", *storagePath, "err", err)
		return 1
	}
	defer func() {
		if err := db.Close(); err != nil {
			logger.Error("close storage", "err", err)
		}
	}()
	lc, err := lifecycle.Open(logger.With("component", "lifecycle"), reg, *storagePath, cfg.Storage, cfg.Compactor)
	if err != nil {
		logger.Error("open bucket", "err", err)
		return 1
	}
	defer func() { _ = lc.Close() }()
	// The block cache may hold copies of rewritten blocks: a sync drops
	// what left the bucket.
	bstore, err := bucketstore.Open(logger.With("component", "bucketstore"), nil, *storagePath, cfg.Storage.Bucket, cfg.BucketStore)
	if err != nil {
		logger.Error("open bucket store", "err", err)
		return 1
	}
	defer func() { _ = bstore.Close() }()
	var after func(context.Context) error
	if bstore != nil {
		after = bstore.Sync
	}
	// The installer pushes' state holds cluster-bound series too; it is
	// opened, not flushed: the next start writes what is left.
	pushes, err := push.Open(logger.With("component", "push"), nil, filepath.Join(*storagePath, "push"), db, cfg.Push, push.Options{})
	if err != nil {
		logger.Error("open push state", "err", err)
		return 1
	}
	defer func() { _ = pushes.Close() }()
	eraser, err := erasure.New(logger.With("component", "erasure"), reg, db, lc, filepath.Join(*storagePath, erasureDir),
		erasure.Options{AfterBucket: after, Pushes: pushes})
	if err != nil {
		logger.Error("open erasure jobs", "err", err)
		return 1
	}
	// The status page's saved clusters hold the id too: the job's forget
	// writes them again without it (forgetting).
	limiter := limits.New(nil, cfg.Limits, nil)
	limiter.TrackClusters(receive.Reasons())
	eraser.SetLimiter(forgetting{limiter, openStatusClusters(logger, nil, limiter, *storagePath, db.Denied)})
	if *readmit {
		ok, err := eraser.Readmit(*tenant, *clusterID, *requestedBy, "offline")
		if err != nil {
			logger.Error("readmit", "err", err)
			return 1
		}
		fmt.Fprintf(stderr, "readmitted: %t\n", ok)
		return 0
	}
	deny := !*noDeny
	st, err := eraser.Submit(erasure.Request{Tenant: *tenant, ClusterID: *clusterID, Selector: *selector, Deny: &deny, RequestedBy: *requestedBy, Caller: "offline"})
	if err != nil {
		logger.Error("erase", "err", err)
		return 2
	}
	// Resumed jobs first (New queued them), then this one.
	code := 0
	for _, s := range eraser.List(*tenant) {
		if s.State == erasure.StateDone {
			continue
		}
		if err := eraser.Do(ctx, s.ID); err != nil {
			logger.Error("erasure failed; run the command again to resume it", "job", s.ID, "err", err)
			code = 1
		}
	}
	st, _ = eraser.Get(st.ID)
	out, _ := json.MarshalIndent(st, "", "  ")
	fmt.Fprintln(stderr, string(out))
	return code
}
