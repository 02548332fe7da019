// Command headfloor measures the memory floor under the receiver (issue 19):
// a Go process that is nothing but Prometheus' TSDB, opened with the options
// the receiver gives a tenant, holding the benchmark fleet's series. No HTTP,
// no decoder, no limiter, no status page. What it holds per series is what
// any receiver built on Prometheus' head holds at least.
//
//	go run -tags dedupelabels ./bench/cmd/headfloor --clusters=2000 --rounds=10
//
// It appends the telemetry shape (one sample per series per round, rounds
// 4m30s apart), then runs a GC, returns free memory to the OS, waits, and
// reports RSS (anonymous and file-backed) and the heap in use, per series.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/compression"

	"github.com/phonehome/phonehome/bench"
	"github.com/phonehome/phonehome/bench/fleet"
	"github.com/phonehome/phonehome/bench/scenario"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "headfloor:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		clusters   = flag.Int("clusters", 2000, "Clusters.")
		perCluster = flag.Int("series-per-cluster", 500, "Series per cluster.")
		rounds     = flag.Int("rounds", 10, "Samples per series.")
		step       = flag.Duration("step", 270*time.Second, "Sample time between rounds.")
		seed       = flag.Uint64("seed", 1, "Fleet seed (benchrun's default).")
		settle     = flag.Duration("settle", 10*time.Second, "Wait after the release before reading RSS.")
		gogc       = flag.Int("gogc", 70, "GOGC, as the receiver's default.")
		stripe     = flag.Int("stripe-size", 0, "TSDB's head stripe size (0: its default, 16384).")
		heapProf   = flag.String("heap-profile", "", "Write a heap profile here after the reading.")
	)
	flag.Parse()
	debug.SetGCPercent(*gogc)

	idle := readRSS()
	tmpl, err := fleet.LoadTemplateFiles(bench.FederateSample, bench.TelemetryAllowlist)
	if err != nil {
		return err
	}
	f, err := fleet.New(tmpl, *clusters, *perCluster, *seed)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "headfloor")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// The options storage/tenant.go gives every tenant.
	opts := tsdb.DefaultOptions()
	block := (2 * time.Hour).Milliseconds()
	opts.MinBlockDuration, opts.MaxBlockDuration = block, block
	opts.OutOfOrderTimeWindow = (6 * time.Hour).Milliseconds()
	opts.EnableOverlappingCompaction = false
	opts.WALCompression = compression.Snappy
	opts.IsolationDisabled = true
	if *stripe > 0 {
		opts.StripeSize = *stripe
	}
	db, err := tsdb.Open(dir, slog.New(slog.DiscardHandler), nil, opts, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	db.DisableCompactions()

	symbols := labels.NewSymbolTable()
	sb := labels.NewScratchBuilderWithSymbolTable(symbols, 16)
	refs := make([]storage.SeriesRef, f.ActiveSeries())
	// As benchrun: rounds that straddle a 2h boundary would hold two head
	// chunks per series until the older one is memory-mapped.
	t0 := scenario.FirstTimestamp(time.Now(), *rounds, *step).UnixMilli()
	var batch fleet.Batch
	start := time.Now()
	for r := range *rounds {
		for c := range f.Clusters() {
			app := db.Appender(nil) //nolint:staticcheck // the head appender ignores its context
			f.Fill(&batch, c, 0, f.SeriesPerCluster(), r, t0, step.Milliseconds())
			for j, ts := range batch.Series {
				i := c*f.SeriesPerCluster() + j
				var lset labels.Labels
				if refs[i] == 0 {
					sb.Reset()
					for _, l := range ts.Labels {
						sb.Add(l.Name, l.Value)
					}
					sb.Sort()
					lset = sb.Labels()
				}
				ref, err := app.Append(refs[i], lset, ts.Samples[0].Timestamp, ts.Samples[0].Value)
				if err != nil {
					return fmt.Errorf("append: %w", err)
				}
				refs[i] = ref
			}
			if err := app.Commit(); err != nil {
				return err
			}
		}
	}
	load := time.Since(start)
	series := len(refs)
	refs = nil //nolint:ineffassign,wastedassign // measured without the program's own table
	runtime.GC()
	debug.FreeOSMemory()
	time.Sleep(*settle)
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	after := readRSS()
	per := func(b uint64) float64 { return float64(b) / float64(series) }
	fmt.Printf("series %d, samples per series %d, load %s, head series %d\n", series, *rounds, load.Round(time.Millisecond), db.Head().NumSeries())
	fmt.Printf("idle RSS before the DB: %.1f MiB (anon %.1f, file %.1f)\n", mib(idle.rss), mib(idle.anon), mib(idle.file))
	fmt.Printf("RSS:             %.1f MiB = %.0f B per series\n", mib(after.rss), per(after.rss))
	fmt.Printf("  anonymous:     %.1f MiB = %.0f B per series\n", mib(after.anon), per(after.anon))
	fmt.Printf("  file-backed:   %.1f MiB = %.0f B per series\n", mib(after.file), per(after.file))
	fmt.Printf("heap in use:     %.1f MiB = %.0f B per series\n", mib(ms.HeapInuse), per(ms.HeapInuse))
	fmt.Printf("RSS growth over idle: %.0f B per series\n", per(after.rss-idle.rss))
	if *heapProf != "" {
		if err := writeHeapProfile(*heapProf); err != nil {
			return err
		}
	}
	runtime.KeepAlive(db)
	return nil
}

type rss struct{ rss, anon, file uint64 }

// readRSS reads VmRSS, RssAnon and RssFile from /proc/self/status.
func readRSS() rss {
	b, _ := os.ReadFile("/proc/self/status")
	var r rss
	for line := range strings.SplitSeq(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseUint(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			r.rss = kb << 10
		case "RssAnon:":
			r.anon = kb << 10
		case "RssFile:":
			r.file = kb << 10
		}
	}
	return r
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
