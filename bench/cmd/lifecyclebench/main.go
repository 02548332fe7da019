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
	cryptorand "crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/index"
	"github.com/prometheus/prometheus/tsdb/tombstones"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/phonehome/phonehome/bench"
	"github.com/phonehome/phonehome/bench/fleet"
	"github.com/phonehome/phonehome/bench/scenario"
	"github.com/phonehome/phonehome/query"
	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/bucketstore"
	"github.com/phonehome/phonehome/storage/lifecycle"
)

// queries are the fleet dashboards' panels over raw data (what the
// recording rules of deploy/rules/fleet.rules.yaml compute), the expensive
// case of a dashboard without the recorded series.
type dashQuery struct{ name, expr string }

var allQueries = []dashQuery{
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
		dir        = fs.String("dir", "", "Work directory (required; emptied by the backfill stage).")
		prom       = fs.String("prometheus", "/usr/bin/prometheus", "Prometheus binary; empty skips it.")
		promWait   = fs.Duration("prometheus-compaction-timeout", 20*time.Minute, "How long to wait for Prometheus to compact the 2h blocks.")
		workers    = fs.Int("workers", 2, "Parallel block writers.")
		queryDays  = fs.String("ranges", "7,30", "Query ranges in days, comma separated.")
		skipErase  = fs.Bool("skip-erase", false, "Skip the erasure.")
		resolution = fs.Int("points", 250, "Points per range query (step = range / points), as a Grafana panel asks.")
		compRanges = fs.String("compactor-ranges", "2h,12h,2d,14d", "compactor.ranges, comma separated.")
		skip2h     = fs.Bool("skip-2h-queries", false, "Do not query the 2h blocks (the slow part).")
		stagesFlag = fs.String("stages", strings.Join(allStages, ","), "Stages to run, in this order: "+strings.Join(allStages, ", ")+
			". Every stage but backfill continues from the state the earlier ones left in --dir (state.json), so a failed or skipped stage can be run on its own.")
		queryNames = fs.String("queries", "", "Dashboard panels to run, comma separated (default all).")
		maxSamples = fs.Int("query-max-samples", 50_000_000, "Samples one query may load, ours and Prometheus' (--query.max-samples); both default to 50M.")
		resume     = fs.Bool("resume", false, "Backfill: keep the complete blocks a crashed backfill left in --dir and write only the missing windows.")
		endFlag    = fs.String("end", "", "End of the data, RFC 3339 (default now, truncated to 2h); the backfill stage only.")
		verbose    = fs.Bool("v", false, "Log at info level (the compactor's merges) to stderr.")
		cpuProfile = fs.String("cpuprofile", "", "Write a CPU profile of the whole run to this file.")
		eagerDel   = fs.Bool("delete-compacted-at-once", false, "Delete compaction sources as soon as they are marked (instead of after the deletion delay), to keep the disk peak down at full size.")
	)
	if err := fs.Parse(args); err != nil || *dir == "" {
		fmt.Fprintln(stderr, "lifecyclebench: --dir is required")
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "lifecyclebench: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "lifecyclebench: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	stages := map[string]bool{}
	for _, st := range strings.Split(*stagesFlag, ",") {
		if !slices.Contains(allStages, st) {
			fmt.Fprintf(stderr, "lifecyclebench: unknown stage %q (want %s)\n", st, strings.Join(allStages, ", "))
			return 2
		}
		stages[st] = true
	}
	if *skip2h {
		delete(stages, stage2hQueries)
	}
	if *prom == "" {
		delete(stages, stagePromCompact)
		delete(stages, stagePromQueries)
	}
	if *skipErase {
		delete(stages, stageErase)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	b := &bencher{
		logger: logger, out: stdout, clusters: *clusters, series: *series, step: *step,
		end: time.Now().Truncate(2 * time.Hour), dir: *dir, points: *resolution, maxSamples: *maxSamples,
		eagerDelete: *eagerDel, resume: *resume,
	}
	if *endFlag != "" {
		end, err := time.Parse(time.RFC3339, *endFlag)
		if err != nil {
			fmt.Fprintf(stderr, "lifecyclebench: bad --end: %v\n", err)
			return 2
		}
		b.end = end.Truncate(2 * time.Hour)
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
	b.queries = allQueries
	if *queryNames != "" {
		b.queries = nil
		for _, n := range strings.Split(*queryNames, ",") {
			i := slices.IndexFunc(allQueries, func(q dashQuery) bool { return q.name == n })
			if i < 0 {
				fmt.Fprintf(stderr, "lifecyclebench: unknown query %q\n", n)
				return 2
			}
			b.queries = append(b.queries, allQueries[i])
		}
	}
	if err := b.run(context.Background(), stages, *workers, *prom, *promWait); err != nil {
		fmt.Fprintf(stderr, "lifecyclebench: %v\n", err)
		return 1
	}
	return 0
}

// The stages, in the order they run. Prometheus compacts the 2h blocks
// before our compactor does: its data directory holds hard links to the
// bucket's 2h blocks (no second copy), so the 2h blocks take disk space
// until both have compacted them, and our compactor, run second, frees
// them as it goes (with --delete-compacted-at-once).
const (
	stageBackfill     = "backfill"
	stage2hQueries    = "2h-queries"
	stagePromCompact  = "prom-compact"
	stagePromQueries  = "prom-queries"
	stageCompact      = "compact"
	stageQueries      = "queries"
	stageErase        = "erase"
	stateFile         = "state.json"
	promListenAddress = "127.0.0.1:0"
)

var allStages = []string{stageBackfill, stage2hQueries, stagePromCompact, stagePromQueries, stageCompact, stageQueries, stageErase}

// state is what the stages leave for each other in --dir.
type state struct {
	Clusters int           `json:"clusters"`
	Series   int           `json:"series"`
	Step     time.Duration `json:"step"`
	Start    time.Time     `json:"start"`
	End      time.Time     `json:"end"`
	Samples  int64         `json:"samples"`
	// Figures, filled by the stages that made them.
	Backfill    time.Duration `json:"backfill,omitempty"`
	Blocks2h    int           `json:"blocks_2h,omitempty"`
	Bytes2h     int64         `json:"bytes_2h,omitempty"`
	Compact     time.Duration `json:"compact,omitempty"`
	BlocksC     int           `json:"blocks_compacted,omitempty"`
	BytesC      int64         `json:"bytes_compacted,omitempty"`
	PromCompact time.Duration `json:"prom_compact,omitempty"`
	// PromCompactWall is from Prometheus' start to the last change seen
	// (30 s polls): an upper bound, startup and the first minute's wait in.
	PromCompactWall time.Duration `json:"prom_compact_wall,omitempty"`
	PromCompacts    int           `json:"prom_compactions,omitempty"`
	PromBlocks      int           `json:"prom_blocks,omitempty"`
	PromBytes       int64         `json:"prom_bytes,omitempty"`
	EraseTime       time.Duration `json:"erase,omitempty"`
	EraseBlocks     int           `json:"erase_blocks,omitempty"`
	EraseRewrites   int           `json:"erase_rewritten,omitempty"`
	EraseSeries     int           `json:"erase_series,omitempty"`
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
	queries          []dashQuery
	maxSamples       int
	eagerDelete      bool
	resume           bool
	st               state
}

func (b *bencher) printf(format string, args ...any) { fmt.Fprintf(b.out, format, args...) }

// saveState writes the state, over what is on disk: stages may run in
// separate processes at the same time (Prometheus' compaction beside
// ours), each setting only its own figures.
func (b *bencher) saveState() error {
	merged := map[string]json.RawMessage{}
	if raw, err := os.ReadFile(filepath.Join(b.dir, stateFile)); err == nil {
		if err := json.Unmarshal(raw, &merged); err != nil {
			return err
		}
	}
	raw, err := json.Marshal(b.st)
	if err != nil {
		return err
	}
	ours := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &ours); err != nil {
		return err
	}
	maps.Copy(merged, ours)
	if raw, err = json.MarshalIndent(merged, "", "  "); err != nil {
		return err
	}
	tmp := filepath.Join(b.dir, fmt.Sprintf("%s.%d.tmp", stateFile, os.Getpid()))
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(b.dir, stateFile)); err != nil {
		return err
	}
	return json.Unmarshal(raw, &b.st)
}

func (b *bencher) run(ctx context.Context, stages map[string]bool, workers int, prom string, promWait time.Duration) error {
	bucketDir, promDir := filepath.Join(b.dir, "bucket"), filepath.Join(b.dir, "prometheus")
	if stages[stageBackfill] {
		if !b.resume {
			if err := os.RemoveAll(b.dir); err != nil {
				return err
			}
		}
		for _, d := range []string{bucketDir, promDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		b.st = state{Clusters: b.clusters, Series: b.series, Step: b.step, Start: b.start, End: b.end}
	} else {
		raw, err := os.ReadFile(filepath.Join(b.dir, stateFile))
		if err != nil {
			return fmt.Errorf("no backfill in %s (run the backfill stage first): %w", b.dir, err)
		}
		if err := json.Unmarshal(raw, &b.st); err != nil {
			return err
		}
		b.clusters, b.series, b.step, b.start, b.end, b.samples = b.st.Clusters, b.st.Series, b.st.Step, b.st.Start, b.st.End, b.st.Samples
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
	b.printf("# Bucket life cycle: %d clusters × %d series, %s of samples every %s (%s to %s)\n\n", b.clusters, b.series, b.end.Sub(b.start), b.step,
		b.start.UTC().Format(time.RFC3339), b.end.UTC().Format(time.RFC3339))

	if stages[stageBackfill] {
		t0 := time.Now()
		blocks, err := b.backfill(ctx, &linkBucket{Bucket: bkt, dir: bucketDir}, promDir, workers)
		if err != nil {
			return fmt.Errorf("backfill: %w", err)
		}
		b.st.Backfill = time.Since(t0)
		b.st.Samples = b.samples
		b.st.Bytes2h, b.st.Blocks2h = bucketSize(bucketDir)
		if err := b.saveState(); err != nil {
			return err
		}
		b.printf("Backfill: %d samples in %d 2h blocks in %s.\n\n", b.samples, blocks, b.st.Backfill.Round(time.Second))
	}

	if stages[stage2hQueries] {
		b.printf("## Queries on 2h blocks\n\n")
		if err := b.runQueries(ctx, bkt, "2h"); err != nil {
			return err
		}
	}

	if stages[stagePromCompact] {
		if err := b.promCompact(ctx, prom, promDir, promWait); err != nil {
			return fmt.Errorf("prometheus compaction: %w", err)
		}
		if err := b.saveState(); err != nil {
			return err
		}
	}
	if stages[stagePromQueries] {
		b.printf("## Queries on Prometheus (the same 2h blocks, compacted by Prometheus)\n\n")
		if err := b.promQueries(ctx, prom, promDir); err != nil {
			return fmt.Errorf("prometheus queries: %w", err)
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
	var runBkt objstore.Bucket = bkt
	if b.eagerDelete {
		runBkt = &eagerDeleteBucket{Bucket: bkt, dir: bucketDir}
	}
	runner := lifecycle.New(b.logger, nil, runBkt, cfg, lifecycle.Options{Compactor: comp, WorkDir: filepath.Join(b.dir, "work"), Now: func() time.Time { return clock }})
	if stages[stageCompact] {
		t0, cpu0 := time.Now(), bench.ProcessCPU()
		if err := runner.RunOnce(ctx); err != nil {
			return fmt.Errorf("compact: %w", err)
		}
		b.st.Compact = time.Since(t0)
		b.printf("Compaction CPU: %.0f s (this process, user and system).\n\n", (bench.ProcessCPU() - cpu0).Seconds())
		clock = clock.Add(72 * time.Hour) // past the deletion delay: the sources go
		if err := runner.RunOnce(ctx); err != nil {
			return fmt.Errorf("delete sources: %w", err)
		}
		b.st.BytesC, b.st.BlocksC = bucketSize(bucketDir)
		if err := b.saveState(); err != nil {
			return err
		}
		b.printf("Compaction (%v): %d blocks, %d bytes, in %s.\n\n", b.compRanges, b.st.BlocksC, b.st.BytesC, b.st.Compact.Round(time.Second))
	}
	if stages[stageQueries] {
		b.printf("## Queries on compacted blocks\n\n")
		if err := b.runQueries(ctx, bkt, "compacted"); err != nil {
			return err
		}
	}

	if stages[stageErase] {
		id := b.fleet.ClusterID(b.clusters / 2)
		ms := []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", id)}
		t0, cpu0 := time.Now(), bench.ProcessCPU()
		res, err := runner.EraseBucket(ctx, tenant, ms, []string{id}, filepath.Join(b.dir, "erase"), func(done, total int) {
			fmt.Fprintf(os.Stderr, "erase: %d/%d blocks after %s\n", done, total, time.Since(t0).Round(time.Second))
		})
		if err != nil {
			return fmt.Errorf("erase: %w", err)
		}
		b.st.EraseTime, b.st.EraseBlocks, b.st.EraseRewrites, b.st.EraseSeries = time.Since(t0), res.Blocks, res.Rewritten, res.Series
		if err := b.saveState(); err != nil {
			return err
		}
		b.printf("## Erasure of one cluster\n\nBucket step: %d blocks examined, %d rewritten, %d series removed, in %s (%.0f CPU seconds).\n\n",
			res.Blocks, res.Rewritten, res.Series, b.st.EraseTime.Round(time.Millisecond), (bench.ProcessCPU() - cpu0).Seconds())
	}

	rows := []string{"| data | blocks | bucket bytes | bytes/sample |", "| --- | --- | --- | --- |"}
	add := func(what string, n int, size int64) {
		if n > 0 {
			rows = append(rows, fmt.Sprintf("| %s | %d | %d | %.3f |", what, n, size, float64(size)/float64(b.st.Samples)))
		}
	}
	add(fmt.Sprintf("2h blocks (backfill %s)", b.st.Backfill.Round(time.Second)), b.st.Blocks2h, b.st.Bytes2h)
	add(fmt.Sprintf("compacted (%v) in %s", b.compRanges, b.st.Compact.Round(time.Second)), b.st.BlocksC, b.st.BytesC)
	add(fmt.Sprintf("Prometheus' own compaction (%d compactions, %s)", b.st.PromCompacts, b.st.PromCompact.Round(time.Second)), b.st.PromBlocks, b.st.PromBytes)
	b.printf("## Size (%d samples)\n\n%s\n\n", b.st.Samples, strings.Join(rows, "\n"))
	return nil
}

// linkBucket uploads local files into the filesystem bucket as hard links
// (the backfill's blocks are then on disk once, shared by the bucket and
// Prometheus' data directory); anything else is uploaded as usual.
type linkBucket struct {
	objstore.Bucket
	dir string
}

func (l *linkBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	f, ok := r.(*os.File)
	if !ok {
		return l.Bucket.Upload(ctx, name, r, opts...)
	}
	dst := filepath.Join(l.dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.Link(f.Name(), dst)
}

// eagerDeleteBucket deletes a block as soon as its deletion mark is
// uploaded, as a deletion delay of zero applied at once would: the sources
// of a compaction do not wait for the end of the run.
type eagerDeleteBucket struct {
	objstore.Bucket
	dir string
}

func (e *eagerDeleteBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	if err := e.Bucket.Upload(ctx, name, r, opts...); err != nil {
		return err
	}
	if id, file, ok := strings.Cut(name, "/"); ok && file == lifecycle.DeletionMarkFile {
		if _, err := ulid.ParseStrict(id); err == nil {
			return os.RemoveAll(filepath.Join(e.dir, id))
		}
	}
	return nil
}

// backfill writes the fleet's samples as 2h blocks, uploads each to the
// bucket (as a receiver ships it) and moves it into promDir.
func (b *bencher) backfill(ctx context.Context, bkt objstore.Bucket, promDir string, workers int) (int, error) {
	const window = 2 * time.Hour
	var (
		wins    []time.Time
		all     int
		samples atomic.Int64
	)
	doneWins, doneSamples, err := b.completeBlocks(promDir)
	if err != nil {
		return 0, err
	}
	for w := b.start; w.Before(b.end); w = w.Add(window) {
		all++
		if n, ok := doneWins[w.UnixMilli()]; ok {
			samples.Add(n)
			continue
		}
		wins = append(wins, w)
	}
	if len(doneWins) > 0 {
		fmt.Fprintf(os.Stderr, "backfill: resuming, %d of %d windows done (%d samples)\n", all-len(wins), all, doneSamples)
	}
	var (
		next     atomic.Int64
		done     atomic.Int64
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	stepMs := b.step.Milliseconds()
	t0 := b.start.UnixMilli()
	began := time.Now()
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
				if d := done.Add(1); d%10 == 0 {
					fmt.Fprintf(os.Stderr, "backfill: %d/%d blocks after %s\n", d+int64(all-len(wins)), all, time.Since(began).Round(time.Second))
				}
			}
		}()
	}
	wg.Wait()
	b.samples = samples.Load()
	return all, firstErr
}

// completeBlocks returns, with --resume, the windows (by start) whose
// block is complete in the bucket and in promDir, with their samples; it
// removes everything else a crashed backfill left (partial uploads, blocks
// not moved into promDir, temporary directories).
func (b *bencher) completeBlocks(promDir string) (map[int64]int64, int64, error) {
	done := map[int64]int64{}
	if !b.resume {
		return done, 0, nil
	}
	var total int64
	bucketDir := filepath.Join(b.dir, "bucket")
	entries, err := os.ReadDir(bucketDir)
	if err != nil {
		return nil, 0, err
	}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(bucketDir, e.Name(), "meta.json"))
		var meta tsdb.BlockMeta
		if err == nil {
			err = json.Unmarshal(raw, &meta)
		}
		if err == nil {
			_, err = os.Stat(filepath.Join(promDir, e.Name(), "meta.json"))
		}
		if err != nil {
			if err := os.RemoveAll(filepath.Join(bucketDir, e.Name())); err != nil {
				return nil, 0, err
			}
			continue
		}
		w := b.start.UnixMilli() + (meta.MinTime-b.start.UnixMilli())/(2*time.Hour).Milliseconds()*(2*time.Hour).Milliseconds()
		done[w] = int64(meta.Stats.NumSamples)
		total += int64(meta.Stats.NumSamples)
	}
	promEntries, err := os.ReadDir(promDir)
	if err != nil {
		return nil, 0, err
	}
	for _, e := range promEntries {
		if _, err := os.Stat(filepath.Join(bucketDir, e.Name(), "meta.json")); err != nil {
			if err := os.RemoveAll(filepath.Join(promDir, e.Name())); err != nil {
				return nil, 0, err
			}
		}
	}
	tmps, _ := filepath.Glob(filepath.Join(b.dir, "write-*"))
	for _, t := range tmps {
		if err := os.RemoveAll(t); err != nil {
			return nil, 0, err
		}
	}
	return done, total, nil
}

// writeWindow writes the samples of [from, from+window) as one block,
// uploads it and moves it into promDir. It writes the block's index and
// chunks directly, as the head's compaction of the same samples would
// (one XOR chunk per series, the block spanning its first to last sample,
// level 1): tsdb.BlockWriter, which appends every sample to a head first,
// took three times the CPU, too much for the full size on two shared cores.
func (b *bencher) writeWindow(ctx context.Context, bkt objstore.Bucket, promDir string, from time.Time, window time.Duration, t0, stepMs int64) (int64, error) {
	tmp, err := os.MkdirTemp(b.dir, "write-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	fromMs, toMs := from.UnixMilli(), from.Add(window).UnixMilli()
	// Rounds whose timestamps fall in [from, from+window).
	rFirst := int((fromMs - t0 + stepMs - 1) / stepMs)
	rLast := int((toMs - t0 - 1) / stepMs)
	type blockSeries struct {
		lset     labels.Labels
		chk      *chunkenc.XORChunk
		app      chunkenc.Appender
		min, max int64
	}
	var (
		batch   fleet.Batch
		sb      = labels.NewScratchBuilder(16)
		n       int64
		all     = make([]*blockSeries, 0, b.clusters*b.series)
		cur     = make([]*blockSeries, b.series)
		mint    = int64(math.MaxInt64)
		maxt    = int64(math.MinInt64)
		symbols = map[string]struct{}{"": {}} // the head's symbols have "" (its all-postings key)
	)
	for c := range b.clusters {
		clear(cur)
		for r := rFirst; r <= rLast; r++ {
			b.fleet.Fill(&batch, c, 0, b.series, r, t0, stepMs)
			for i, ts := range batch.Series {
				smp := ts.Samples[0]
				if smp.Timestamp < fromMs || smp.Timestamp >= toMs {
					continue // the jitter moved it out of the window
				}
				s := cur[i]
				if s == nil {
					// The series' labels are those of its first sample in
					// the window, as a head appender given its reference
					// afterwards keeps them.
					sb.Reset()
					for _, l := range ts.Labels {
						sb.Add(l.Name, l.Value)
					}
					sb.Sort()
					s = &blockSeries{lset: sb.Labels(), chk: chunkenc.NewXORChunk(), min: smp.Timestamp}
					if s.app, err = s.chk.Appender(); err != nil {
						return n, windowErr(from, err)
					}
					s.lset.Range(func(l labels.Label) {
						symbols[l.Name] = struct{}{}
						symbols[l.Value] = struct{}{}
					})
					cur[i] = s
					all = append(all, s)
				} else if smp.Timestamp <= s.max {
					return n, fmt.Errorf("series %s: sample at %d not after %d", s.lset, smp.Timestamp, s.max)
				}
				s.app.Append(0, smp.Timestamp, smp.Value)
				s.max = smp.Timestamp
				mint, maxt = min(mint, smp.Timestamp), max(maxt, smp.Timestamp)
				n++
			}
		}
	}
	if len(all) == 0 {
		return 0, nil
	}
	slices.SortFunc(all, func(x, y *blockSeries) int { return labels.Compare(x.lset, y.lset) })
	id := ulid.MustNew(ulid.Now(), cryptorand.Reader)
	blockDir := filepath.Join(tmp, id.String())
	cw, err := chunks.NewWriter(filepath.Join(blockDir, "chunks"))
	if err != nil {
		return n, windowErr(from, err)
	}
	defer func() {
		if cw != nil {
			_ = cw.Close()
		}
	}()
	iw, err := index.NewWriter(ctx, filepath.Join(blockDir, "index"))
	if err != nil {
		return n, windowErr(from, err)
	}
	// Close each writer once: a second Close of an index writer unmaps its
	// symbol table again, by then perhaps another writer's mapping.
	defer func() {
		if iw != nil {
			_ = iw.Close()
		}
	}()
	for _, sym := range slices.Sorted(maps.Keys(symbols)) {
		if err := iw.AddSymbol(sym); err != nil {
			return n, windowErr(from, err)
		}
	}
	var prev labels.Labels
	for i, s := range all {
		if i > 0 && labels.Equal(s.lset, prev) {
			return n, fmt.Errorf("series %s twice in a cluster's batch", s.lset)
		}
		metas := []chunks.Meta{{MinTime: s.min, MaxTime: s.max, Chunk: s.chk}}
		if err := cw.WriteChunks(metas...); err != nil { // sets metas[0].Ref
			return n, windowErr(from, err)
		}
		if err := iw.AddSeries(promstorage.SeriesRef(i+1), s.lset, metas...); err != nil {
			return n, windowErr(from, err)
		}
		prev = s.lset
		all[i] = nil // the chunk is written: let it go
	}
	nSeries := uint64(len(all))
	err = iw.Close()
	iw = nil
	if err != nil {
		return n, windowErr(from, err)
	}
	err = cw.Close()
	cw = nil
	if err != nil {
		return n, windowErr(from, err)
	}
	if _, err := tombstones.WriteFile(b.logger, blockDir, tombstones.NewMemTombstones()); err != nil {
		return n, windowErr(from, err)
	}
	meta := tsdb.BlockMeta{ULID: id, MinTime: mint, MaxTime: maxt + 1, Version: 1,
		Stats: tsdb.BlockStats{NumSamples: uint64(n), NumFloatSamples: uint64(n), NumSeries: nSeries, NumChunks: nSeries}}
	meta.Compaction.Level = 1
	meta.Compaction.Sources = []ulid.ULID{id}
	raw, err := json.MarshalIndent(&meta, "", "\t")
	if err != nil {
		return n, windowErr(from, err)
	}
	if err := os.WriteFile(filepath.Join(blockDir, "meta.json"), raw, 0o644); err != nil {
		return n, windowErr(from, err)
	}
	if err := storage.UploadBlock(ctx, bkt, blockDir, meta, map[string]string{"tenant_id": tenant, "replica": "r0"}, storage.SourceReceive); err != nil {
		return n, windowErr(from, err)
	}
	return n, os.Rename(blockDir, filepath.Join(promDir, id.String()))
}

func windowErr(from time.Time, err error) error {
	return fmt.Errorf("window %s: %w", from.UTC().Format(time.RFC3339), err)
}

// emptyLocal is a receiver with no local data: every read goes to the bucket.
type emptyLocal struct{}

func (emptyLocal) Querier(string, int64, int64) (promstorage.Querier, error) {
	return promstorage.NoopQuerier(), nil
}
func (emptyLocal) LocalBlocks(string) []ulid.ULID { return nil }

// queries runs every query over every range, with a cold cache (a new,
// empty one) and then warm (the same store again).
func (b *bencher) runQueries(ctx context.Context, bkt objstore.Bucket, label string) error {
	reg := prometheus.NewRegistry()
	cache := filepath.Join(b.dir, "cache-"+label)
	store, err := bucketstore.New(b.logger, reg, bkt, cache, bucketstore.Options{CacheMaxBytes: 64 << 30, DownloadTimeout: time.Hour})
	if err != nil {
		return err
	}
	// The last store and its cache go at the end: a cold cache of a
	// compacted bucket is a second copy of it on disk.
	defer func() {
		_ = store.Close()
		_ = os.RemoveAll(cache)
	}()
	if err := store.Sync(ctx); err != nil {
		return err
	}
	reader := bucketstore.NewReader(emptyLocal{}, store)
	eng := query.NewEngine(b.logger, nil, query.Options{MaxSamples: b.maxSamples, Timeout: 2 * time.Hour})
	queryable := promstorage.QueryableFunc(func(mint, maxt int64) (promstorage.Querier, error) {
		return reader.Querier(tenant, mint, maxt)
	})
	b.printf("| range | cache | query | seconds | CPU seconds | series | downloaded bytes |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, rng := range b.ranges {
		for _, pass := range []string{"cold", "warm"} {
			var total time.Duration
			var totalCPU float64
			for _, q := range b.queries {
				before := downloaded(reg)
				t0, cpu0 := time.Now(), bench.ProcessCPU()
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
				d, cpu := time.Since(t0), (bench.ProcessCPU() - cpu0).Seconds()
				total += d
				totalCPU += cpu
				b.printf("| %s | %s | %s | %.3f | %.2f | %d | %d |\n", days(rng), pass, q.name, d.Seconds(), cpu, n, downloaded(reg)-before)
			}
			b.printf("| %s | %s | **dashboard** | **%.3f** | **%.2f** | | |\n", days(rng), pass, total.Seconds(), totalCPU)
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

// promServer is Debian's Prometheus on the benchmark's data directory.
type promServer struct {
	cmd  *exec.Cmd
	addr string
}

func (b *bencher) startPrometheus(bin, dataDir string) (*promServer, error) {
	cfg := filepath.Join(b.dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte("global: {}\n"), 0o644); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", promListenAddress)
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	logf, err := os.OpenFile(filepath.Join(b.dir, "prometheus.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+dataDir, "--storage.tsdb.retention.time=400d",
		"--web.listen-address="+addr, "--log.level=info",
		fmt.Sprintf("--query.max-samples=%d", b.maxSamples), "--query.timeout=2h")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() { _ = cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(15 * time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return &promServer{cmd: cmd, addr: addr}, nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	return nil, errors.New("not ready")
}

func (p *promServer) stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	for range 600 {
		if p.cmd.ProcessState != nil || p.cmd.Process.Signal(syscall.Signal(0)) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = p.cmd.Process.Kill()
}

// metric returns the sum of a metric's values on Prometheus' /metrics.
func (p *promServer) metric(name string) float64 {
	v, err := scenario.SumMetric(context.Background(), "http://"+p.addr, name)
	switch {
	case errors.Is(err, scenario.ErrNoMetric):
		return 0
	case err != nil:
		return math.NaN()
	}
	return v
}

// promWriting reports whether Prometheus is writing a block (a directory
// named <ulid>.tmp-for-creation).
func promWriting(dataDir string) bool {
	entries, _ := os.ReadDir(dataDir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp-for-creation") {
			return true
		}
	}
	return false
}

func promBlocks(dataDir string) (int, int64) {
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
	return n, size
}

// promCompact starts Prometheus on promDir and waits until it has
// compacted the 2h blocks (its compaction metrics stop moving), then stops
// it. The compaction time is Prometheus' own
// prometheus_tsdb_compaction_duration_seconds_sum.
func (b *bencher) promCompact(ctx context.Context, bin, dataDir string, wait time.Duration) error {
	t0 := time.Now()
	p, err := b.startPrometheus(bin, dataDir)
	if err != nil {
		return err
	}
	defer p.stop()
	fmt.Fprintf(os.Stderr, "prometheus: ready after %s\n", time.Since(t0).Round(time.Second))
	// Prometheus compacts in its background loop (every minute), one plan
	// after another: wait until the block count and the compactions stop
	// changing for three minutes.
	deadline := time.Now().Add(wait)
	lastN, _ := promBlocks(dataDir)
	lastC, stable, lastChange := p.metric("prometheus_tsdb_compactions_total"), 0, time.Now()
	for stable < 4 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(30 * time.Second)
		n, _ := promBlocks(dataDir)
		c := p.metric("prometheus_tsdb_compactions_total")
		writing := promWriting(dataDir)
		fmt.Fprintf(os.Stderr, "prometheus: %d blocks, %v compactions, %.0f s compacting, writing %v, after %s\n", n, c,
			p.metric("prometheus_tsdb_compaction_duration_seconds_sum"), writing, time.Since(t0).Round(time.Second))
		if n == lastN && c == lastC && !writing && p.metric("prometheus_tsdb_compactions_triggered_total") > 0 {
			stable++
		} else {
			lastN, lastC, stable, lastChange = n, c, 0, time.Now()
		}
	}
	if stable < 4 {
		return fmt.Errorf("still compacting after %s", wait)
	}
	b.st.PromCompactWall = lastChange.Sub(t0)
	b.st.PromCompact = time.Duration(p.metric("prometheus_tsdb_compaction_duration_seconds_sum") * float64(time.Second))
	b.st.PromCompacts = int(p.metric("prometheus_tsdb_compactions_total"))
	b.printf("Prometheus process CPU until then: %.0f s (start-up and block loading included).\n\n", p.metric("process_cpu_seconds_total"))
	b.st.PromBlocks, b.st.PromBytes = promBlocks(dataDir)
	b.printf("Prometheus compaction: %d compactions, %s compacting (its metric; %s from its start to the last change), %d blocks, %d bytes (%.3f bytes/sample).\n\n",
		b.st.PromCompacts, b.st.PromCompact.Round(time.Second), b.st.PromCompactWall.Round(time.Second), b.st.PromBlocks, b.st.PromBytes, float64(b.st.PromBytes)/float64(b.st.Samples))
	return nil
}

// promQueries starts Prometheus on its compacted data directory and runs
// the queries through its HTTP API: cold (the first run after the start)
// and warm.
func (b *bencher) promQueries(ctx context.Context, bin, dataDir string) error {
	p, err := b.startPrometheus(bin, dataDir)
	if err != nil {
		return err
	}
	defer p.stop()
	b.printf("| range | cache | query | seconds | CPU seconds | series |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, rng := range b.ranges {
		for _, pass := range []string{"cold", "warm"} {
			var total time.Duration
			var totalCPU float64
			for _, q := range b.queries {
				t0, cpu0 := time.Now(), p.metric("process_cpu_seconds_total")
				n, err := promRange(ctx, p.addr, q.expr, b.end.Add(-rng), b.end, rng/time.Duration(b.points))
				if err != nil {
					return fmt.Errorf("%s: %w", q.name, err)
				}
				d, cpu := time.Since(t0), p.metric("process_cpu_seconds_total")-cpu0
				total += d
				totalCPU += cpu
				b.printf("| %s | %s | %s | %.3f | %.2f | %d |\n", days(rng), pass, q.name, d.Seconds(), cpu, n)
			}
			b.printf("| %s | %s | **dashboard** | **%.3f** | **%.2f** | |\n", days(rng), pass, total.Seconds(), totalCPU)
		}
	}
	b.printf("\n")
	return nil
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
