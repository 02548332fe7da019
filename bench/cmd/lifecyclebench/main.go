// Command lifecyclebench measures the bucket's life cycle (issue 17): a
// tenant of clusters × series over days, backfilled as 2h blocks into a
// filesystem bucket, queried with the fleet dashboards' queries over 7 and
// 30 days with a cold and a warm block cache, then compacted (with
// compactor.ranges' default) and queried again, side by side with Debian's
// Prometheus holding the same 2h blocks (which it compacts itself); and the
// erasure of one cluster over the compacted bucket. It prints a Markdown
// report.
//
//	go run -tags dedupelabels ./bench/cmd/lifecyclebench --clusters=1000 --series=500 --days=30 --dir=/tmp/lc
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/bench"
	"github.com/phonehome/phonehome/bench/fleet"
	"github.com/phonehome/phonehome/query"
	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
	"github.com/phonehome/phonehome/storage/lifecycle"
)

// queries are the fleet dashboards' panels over raw data (what the
// recording rules of deploy/rules/fleet.rules.yaml compute), the expensive
// case of a dashboard without the recorded series.
var queries = []struct{ name, expr string }{
	{"csv_running_by_version", `count by (name, version) (group by (_id, name, version) (max_over_time(csv_succeeded[15m])) or group by (_id, name, version) (max_over_time(csv_abnormal[15m])))`},
	{"csv_failing_by_version", `count by (name, version) (group by (_id, name, version) (group by (_id, namespace, name, version) (max_over_time(csv_abnormal[15m])) unless on (_id, namespace, name, version) (max_over_time(csv_succeeded[15m]) == 1)))`},
	{"clusters_reporting", `count(group by (_id) (cluster_version{_id!=""}))`},
	{"operator_conditions", `sum by (name, condition) (cluster_operator_conditions)`},
	{"series_per_cluster_p50", `quantile(0.5, count by (_id) ({_id!=""}))`},
}

const tenant = "fleet"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lifecyclebench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		clusters   = fs.Int("clusters", 1000, "Clusters.")
		series     = fs.Int("series", 500, "Series per cluster.")
		days       = fs.Int("days", 30, "Days of data, ending now.")
		step       = fs.Duration("step", 270*time.Second, "Sample interval (the forwarder's default 4m30s).")
		dir        = fs.String("dir", "", "Work directory (required; emptied).")
		prom       = fs.String("prometheus", "/usr/bin/prometheus", "Prometheus binary; empty skips it.")
		promWait   = fs.Duration("prometheus-compaction-timeout", 20*time.Minute, "How long to wait for Prometheus to compact the 2h blocks.")
		workers    = fs.Int("workers", 2, "Parallel block writers.")
		queryDays  = fs.String("ranges", "7,30", "Query ranges in days, comma separated.")
		skipErase  = fs.Bool("skip-erase", false, "Skip the erasure.")
		resolution = fs.Int("points", 250, "Points per range query (step = range / points), as a Grafana panel asks.")
		compRanges = fs.String("compactor-ranges", "2h,12h,2d,14d", "compactor.ranges, comma separated.")
		skip2h     = fs.Bool("skip-2h-queries", false, "Do not query the 2h blocks (the slow part).")
	)
	if err := fs.Parse(args); err != nil || *dir == "" {
		fmt.Fprintln(stderr, "lifecyclebench: --dir is required")
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b := &bencher{
		logger: logger, out: stdout, clusters: *clusters, series: *series, step: *step,
		end: time.Now().Truncate(2 * time.Hour), dir: *dir, points: *resolution,
	}
	b.start = b.end.Add(-time.Duration(*days) * 24 * time.Hour)
	for _, d := range strings.Split(*queryDays, ",") {
		var n int
		if _, err := fmt.Sscan(d, &n); err != nil || n <= 0 {
			fmt.Fprintf(stderr, "lifecyclebench: bad --ranges %q\n", *queryDays)
			return 2
		}
		b.ranges = append(b.ranges, time.Duration(n)*24*time.Hour)
	}
	for _, r := range strings.Split(*compRanges, ",") {
		d, err := model.ParseDuration(r)
		if err != nil {
			fmt.Fprintf(stderr, "lifecyclebench: bad --compactor-ranges %q\n", *compRanges)
			return 2
		}
		b.compRanges = append(b.compRanges, d)
	}
	b.skip2h = *skip2h
	if err := b.run(context.Background(), *workers, *prom, *promWait, *skipErase); err != nil {
		fmt.Fprintf(stderr, "lifecyclebench: %v\n", err)
		return 1
	}
	return 0
}

type bencher struct {
	logger           *slog.Logger
	out              io.Writer
	clusters, series int
	step             time.Duration
	start, end       time.Time
	dir              string
	points           int
	ranges           []time.Duration
	samples          int64
	fleet            *fleet.Fleet
	compRanges       []model.Duration
	skip2h           bool
}

func (b *bencher) printf(format string, args ...any) { fmt.Fprintf(b.out, format, args...) }

func (b *bencher) run(ctx context.Context, workers int, prom string, promWait time.Duration, skipErase bool) error {
	if err := os.RemoveAll(b.dir); err != nil {
		return err
	}
	bucketDir, promDir := filepath.Join(b.dir, "bucket"), filepath.Join(b.dir, "prometheus")
	for _, d := range []string{bucketDir, promDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	tmpl, err := fleet.LoadTemplateFiles(bench.FederateSample, bench.TelemetryAllowlist)
	if err != nil {
		return err
	}
	if b.fleet, err = fleet.New(tmpl, b.clusters, b.series, 1); err != nil {
		return err
	}
	bkt, err := filesystem.NewBucket(bucketDir)
	if err != nil {
		return err
	}
	b.printf("# Bucket life cycle: %d clusters × %d series, %s of samples every %s\n\n", b.clusters, b.series, b.end.Sub(b.start), b.step)

	t0 := time.Now()
	blocks, err := b.backfill(ctx, bkt, promDir, workers)
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	size2h, n2h := bucketSize(bucketDir)
	b.printf("Backfill: %d samples in %d 2h blocks in %s.\n\n", b.samples, blocks, time.Since(t0).Round(time.Second))

	var rows []string
	header := "| data | blocks | bucket bytes | bytes/sample |"
	rows = append(rows, header, "| --- | --- | --- | --- |",
		fmt.Sprintf("| 2h blocks | %d | %d | %.3f |", n2h, size2h, float64(size2h)/float64(b.samples)))

	if !b.skip2h {
		b.printf("## Queries on 2h blocks\n\n")
		if err := b.queries(ctx, bkt, "2h"); err != nil {
			return err
		}
	}

	cfg := storage.Config{}
	cfg.SetDefaults()
	comp := lifecycle.CompactorConfig{}
	comp.SetDefaults()
	enabled := true
	comp.Enabled, comp.Wait, comp.Ranges = &enabled, 0, b.compRanges
	if err := comp.Validate(); err != nil {
		return err
	}
	clock := b.end.Add(24 * time.Hour)
	runner := lifecycle.New(b.logger, nil, bkt, cfg, lifecycle.Options{Compactor: comp, WorkDir: filepath.Join(b.dir, "work"), Now: func() time.Time { return clock }})
	t0 = time.Now()
	if err := runner.RunOnce(ctx); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	compactTime := time.Since(t0)
	clock = clock.Add(72 * time.Hour) // past the deletion delay: the sources go
	if err := runner.RunOnce(ctx); err != nil {
		return fmt.Errorf("delete sources: %w", err)
	}
	sizeC, nC := bucketSize(bucketDir)
	rows = append(rows, fmt.Sprintf("| compacted (%v) in %s | %d | %d | %.3f |", b.compRanges, compactTime.Round(time.Second), nC, sizeC, float64(sizeC)/float64(b.samples)))
	b.printf("## Queries on compacted blocks\n\n")
	if err := b.queries(ctx, bkt, "compacted"); err != nil {
		return err
	}

	if prom != "" {
		b.printf("## Queries on Prometheus (the same 2h blocks, compacted by Prometheus)\n\n")
		n, size, err := b.prometheus(ctx, prom, promDir, promWait)
		if err != nil {
			return fmt.Errorf("prometheus: %w", err)
		}
		rows = append(rows, fmt.Sprintf("| Prometheus' own compaction | %d | %d | %.3f |", n, size, float64(size)/float64(b.samples)))
	}
	b.printf("## Size\n\n%s\n\n", strings.Join(rows, "\n"))

	if !skipErase {
		id := b.fleet.ClusterID(b.clusters / 2)
		ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", id)}
		t0 = time.Now()
		res, err := runner.EraseBucket(ctx, tenant, ms, []string{id}, filepath.Join(b.dir, "erase"), func(int, int) {})
		if err != nil {
			return fmt.Errorf("erase: %w", err)
		}
		b.printf("## Erasure of one cluster\n\nBucket step over the compacted bucket: %d blocks examined, %d rewritten, %d series removed, in %s.\n",
			res.Blocks, res.Rewritten, res.Series, time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

// backfill writes the fleet's samples as 2h blocks, uploads each to the
// bucket (as a receiver ships it) and copies it into promDir.
func (b *bencher) backfill(ctx context.Context, bkt objstore.Bucket, promDir string, workers int) (int, error) {
	const window = 2 * time.Hour
	var wins []time.Time
	for w := b.start; w.Before(b.end); w = w.Add(window) {
		wins = append(wins, w)
	}
	var (
		next     atomic.Int64
		samples  atomic.Int64
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	stepMs := b.step.Milliseconds()
	t0 := b.start.UnixMilli()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(wins) {
					return
				}
				n, err := b.writeWindow(ctx, bkt, promDir, wins[i], window, t0, stepMs)
				samples.Add(n)
				if err != nil {
					errMu.Lock()
					firstErr = errors.Join(firstErr, err)
					errMu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	b.samples = samples.Load()
	return len(wins), firstErr
}

func (b *bencher) writeWindow(ctx context.Context, bkt objstore.Bucket, promDir string, from time.Time, window time.Duration, t0, stepMs int64) (int64, error) {
	tmp, err := os.MkdirTemp(b.dir, "write-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	w, err := tsdb.NewBlockWriter(b.logger, tmp, window.Milliseconds())
	if err != nil {
		return 0, err
	}
	defer w.Close()
	// Rounds whose timestamps fall in [from, from+window).
	rFirst := int((from.UnixMilli() - t0 + stepMs - 1) / stepMs)
	rLast := int((from.Add(window).UnixMilli() - t0 - 1) / stepMs)
	var (
		batch fleet.Batch
		sb    = labels.NewScratchBuilder(16)
		n     int64
	)
	app := w.Appender(ctx)
	refs := make([]promstorage.SeriesRef, b.series)
	for c := range b.clusters {
		clear(refs)
		for r := rFirst; r <= rLast; r++ {
			b.fleet.Fill(&batch, c, 0, b.series, r, t0, stepMs)
			for i, ts := range batch.Series {
				s := ts.Samples[0]
				if s.Timestamp < from.UnixMilli() || s.Timestamp >= from.Add(window).UnixMilli() {
					continue // the jitter moved it out of the window
				}
				var ls labels.Labels
				if refs[i] == 0 {
					sb.Reset()
					for _, l := range ts.Labels {
						sb.Add(l.Name, l.Value)
					}
					sb.Sort()
					ls = sb.Labels()
				}
				ref, err := app.Append(refs[i], ls, s.Timestamp, s.Value)
				if err != nil {
					return n, err
				}
				refs[i] = ref
				n++
			}
		}
	}
	if err := app.Commit(); err != nil {
		return n, err
	}
	id, err := w.Flush(ctx)
	if err != nil {
		return n, err
	}
	blockDir := filepath.Join(tmp, id.String())
	raw, err := os.ReadFile(filepath.Join(blockDir, "meta.json"))
	if err != nil {
		return n, err
	}
	var meta tsdb.BlockMeta
	if err := json.Unmarshal(raw, &meta); err != nil {
		return n, err
	}
	if err := storage.UploadBlock(ctx, bkt, blockDir, meta, map[string]string{"tenant_id": tenant, "replica": "r0"}, storage.SourceReceive); err != nil {
		return n, err
	}
	return n, os.Rename(blockDir, filepath.Join(promDir, id.String()))
}

// emptyLocal is a receiver with no local data: every read goes to the bucket.
type emptyLocal struct{}

func (emptyLocal) Querier(string, int64, int64) (promstorage.Querier, error) {
	return promstorage.NoopQuerier(), nil
}
func (emptyLocal) LocalBlocks(string) []ulid.ULID { return nil }

// queries runs every query over every range, with a cold cache (a new,
// empty one) and then warm (the same store again).
func (b *bencher) queries(ctx context.Context, bkt objstore.Bucket, label string) error {
	reg := prometheus.NewRegistry()
	cache := filepath.Join(b.dir, "cache-"+label)
	store, err := bucketstore.New(b.logger, reg, bkt, cache, bucketstore.Options{CacheMaxBytes: 64 << 30, DownloadTimeout: time.Hour})
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Sync(ctx); err != nil {
		return err
	}
	reader := bucketstore.NewReader(emptyLocal{}, store)
	eng := query.NewEngine(b.logger, nil, query.Options{})
	queryable := promstorage.QueryableFunc(func(mint, maxt int64) (promstorage.Querier, error) {
		return reader.Querier(tenant, mint, maxt)
	})
	b.printf("| range | cache | query | seconds | series | downloaded bytes |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, rng := range b.ranges {
		for _, pass := range []string{"cold", "warm"} {
			var total time.Duration
			for _, q := range queries {
				before := downloaded(reg)
				t0 := time.Now()
				qry, err := eng.NewRangeQuery(ctx, queryable, nil, q.expr, b.end.Add(-rng), b.end, rng/time.Duration(b.points))
				if err != nil {
					return err
				}
				res := qry.Exec(ctx)
				if res.Err != nil {
					qry.Close()
					return fmt.Errorf("%s: %w", q.name, res.Err)
				}
				m, _ := res.Matrix()
				n := len(m)
				qry.Close()
				d := time.Since(t0)
				total += d
				b.printf("| %s | %s | %s | %.3f | %d | %d |\n", days(rng), pass, q.name, d.Seconds(), n, downloaded(reg)-before)
			}
			b.printf("| %s | %s | **dashboard** | **%.3f** | | |\n", days(rng), pass, total.Seconds())
		}
		// Cold again for the next range: drop the cache.
		if err := store.Close(); err != nil {
			return err
		}
		if err := os.RemoveAll(cache); err != nil {
			return err
		}
		reg = prometheus.NewRegistry()
		if store, err = bucketstore.New(b.logger, reg, bkt, cache, bucketstore.Options{CacheMaxBytes: 64 << 30, DownloadTimeout: time.Hour}); err != nil {
			return err
		}
		if err := store.Sync(ctx); err != nil {
			return err
		}
		reader = bucketstore.NewReader(emptyLocal{}, store)
	}
	b.printf("\n")
	return nil
}

func downloaded(g prometheus.Gatherer) int64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == "phonehome_bucketstore_download_bytes_total" {
			return int64(mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	return 0
}

func days(d time.Duration) string { return fmt.Sprintf("%dd", int(d.Hours()/24)) }

// bucketSize sums the files of complete blocks (meta.json present).
func bucketSize(dir string) (int64, int) {
	var size int64
	n := 0
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "meta.json")); err != nil {
			continue
		}
		n++
		_ = filepath.WalkDir(filepath.Join(dir, e.Name()), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if info, err := d.Info(); err == nil {
					size += info.Size()
				}
			}
			return nil
		})
	}
	return size, n
}

// prometheus starts Prometheus on promDir, waits until it has compacted
// the 2h blocks, runs the queries cold (first run after start) and warm
// through its HTTP API, and returns its blocks and their bytes.
func (b *bencher) prometheus(ctx context.Context, bin, dataDir string, wait time.Duration) (int, int64, error) {
	cfg := filepath.Join(b.dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte("global: {}\n"), 0o644); err != nil {
		return 0, 0, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	start := func() (*exec.Cmd, error) {
		cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+dataDir, "--storage.tsdb.retention.time=400d",
			"--web.listen-address="+addr, "--log.level=warn")
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		deadline := time.Now().Add(5 * time.Minute)
		for time.Now().Before(deadline) {
			if resp, err := http.Get("http://" + addr + "/-/ready"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return cmd, nil
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		_ = cmd.Process.Kill()
		return nil, errors.New("not ready")
	}
	stop := func(cmd *exec.Cmd) {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
	cmd, err := start()
	if err != nil {
		return 0, 0, err
	}
	// Prometheus compacts in its background loop (every minute): wait
	// until the block count stops changing.
	blocks := func() int {
		n := 0
		entries, _ := os.ReadDir(dataDir)
		for _, e := range entries {
			if _, err := ulid.ParseStrict(e.Name()); err == nil {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(wait)
	last, stable := blocks(), 0
	for stable < 3 && time.Now().Before(deadline) {
		time.Sleep(30 * time.Second)
		if n := blocks(); n == last {
			stable++
		} else {
			last, stable = n, 0
		}
	}
	stop(cmd) // restart: the first queries find cold caches of the process
	size, n := int64(0), 0
	entries, _ := os.ReadDir(dataDir)
	for _, e := range entries {
		if _, err := ulid.ParseStrict(e.Name()); err != nil {
			continue
		}
		n++
		_ = filepath.WalkDir(filepath.Join(dataDir, e.Name()), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if info, err := d.Info(); err == nil {
					size += info.Size()
				}
			}
			return nil
		})
	}
	if cmd, err = start(); err != nil {
		return 0, 0, err
	}
	defer stop(cmd)
	b.printf("| range | cache | query | seconds | series |\n| --- | --- | --- | --- | --- |\n")
	for _, rng := range b.ranges {
		for _, pass := range []string{"cold", "warm"} {
			var total time.Duration
			for _, q := range queries {
				t0 := time.Now()
				n, err := promRange(ctx, addr, q.expr, b.end.Add(-rng), b.end, rng/time.Duration(b.points))
				if err != nil {
					return 0, 0, fmt.Errorf("%s: %w", q.name, err)
				}
				d := time.Since(t0)
				total += d
				b.printf("| %s | %s | %s | %.3f | %d |\n", days(rng), pass, q.name, d.Seconds(), n)
			}
			b.printf("| %s | %s | **dashboard** | **%.3f** | |\n", days(rng), pass, total.Seconds())
		}
	}
	b.printf("\n")
	return n, size, nil
}

func promRange(ctx context.Context, addr, expr string, start, end time.Time, step time.Duration) (int, error) {
	u := "http://" + addr + "/api/v1/query_range?" + url.Values{
		"query": {expr}, "start": {fmt.Sprint(start.Unix())}, "end": {fmt.Sprint(end.Unix())},
		"step": {fmt.Sprint(math.Max(1, step.Seconds()))},
	}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, errors.New(r.Error)
	}
	return len(r.Data.Result), nil
}
