// Command benchrun runs a fleet benchmark scenario against the phonehome
// receiver and Debian's Prometheus under identical load, one after the other,
// prints a side-by-side table and records the results in bench/results.
//
//	go build -tags dedupelabels -o bench/tmp/receiver ./cmd/receiver
//	go run ./bench/cmd/benchrun --size=100k
//	go run ./bench/cmd/benchrun --size=1m
//
// It must run from the repository root (paths default to bench/...).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/phonehome/phonehome/bench/scenario"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// preset is a scenario size; step, if set, replaces --step's default.
type preset struct {
	clusters, perCluster, rounds int
	step                         time.Duration
}

// Size presets per scenario: clusters × 500 series, the shape of issue 10's
// fleet. Issue 10's 10k and 50k clusters (5M and 25M active series) do not
// fit this 2-core, 23 GiB machine next to Prometheus; see bench/results/README.md.
var sizes = map[string]map[string]preset{
	"steady": {
		"smoke": {10, 500, 3, 0},
		"100k":  {200, 500, 20, 0},
		"200k":  {400, 500, 12, 0},
		"1k":    {1000, 500, 6, 0}, // 1k clusters = 500k series
		"1m":    {2000, 500, 6, 0},
		// Issue 19's two shapes. Telemetry: one sample per series every
		// 4m30s of sample time, ~10 in the head, as a real fleet holds.
		// Fast: sample time 15s apart and as many rounds as the issue's
		// 45 s load put in VictoriaMetrics (~100 points per series at 200k,
		// ~20 at 1M), so many samples per series sit in the head.
		"200k-telemetry": {400, 500, 10, 0},
		"1m-telemetry":   {2000, 500, 10, 0},
		"200k-fast":      {400, 500, 100, 15 * time.Second},
		"1m-fast":        {2000, 500, 20, 15 * time.Second},
	},
	// 2h of backlog at 4m30s: 27 points per series, replayed oldest first.
	"catchup": {
		"smoke": {10, 500, 27, 0},
		"100k":  {200, 500, 27, 0},
		"200k":  {400, 500, 27, 0},
		"1m":    {2000, 500, 27, 0}, // 27M samples
		// The size, 135M samples (6.5 GB of request bodies): only
		// the receiver fits in memory (--targets=receiver).
		"10k": {10000, 500, 27, 0},
	},
	// 6 simulated hours at 4m30s with 10% of the series replaced per hour.
	"churn": {
		"smoke": {10, 500, 80, 0},
		"50k":   {100, 500, 80, 0},
	},
	// Load, SIGKILL, restart on the same data: WAL replay.
	"restart": {
		"smoke": {10, 500, 3, 0},
		"200k":  {400, 500, 3, 0},
		"1m":    {2000, 500, 3, 0},
	},
	// A simulated day at 4m30s: 320 points per series, in time order.
	"storage": {
		"smoke": {4, 500, 320, 0},
		"10k":   {20, 500, 320, 0},
	},
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		scen         = fs.String("scenario", "steady", "Scenario: "+strings.Join(scenario.Scenarios, ", ")+".")
		size         = fs.String("size", "100k", "Size preset of the scenario (see sizes in main.go; smoke for every scenario).")
		clusters     = fs.Int("clusters", 0, "Override the preset's clusters.")
		perCluster   = fs.Int("series-per-cluster", 0, "Override the preset's series per cluster.")
		rounds       = fs.Int("rounds", 0, "Override the preset's rounds.")
		concurrency  = fs.Int("concurrency", 8, "Parallel requests.")
		batch        = fs.Int("batch-series", 500, "Max series per request.")
		step         = fs.Duration("step", 270*time.Second, "Simulated time between rounds.")
		seed         = fs.Uint64("seed", 1, "Load seed (the same for every target).")
		repeat       = fs.Int("repeat", 1, "Run the targets this many times, interleaved; figures are medians.")
		targets      = fs.String("targets", "prometheus,receiver", "Targets, run in this order: receiver, prometheus, victoriametrics (skipped with a message if not installed).")
		protocol     = fs.String("protocol", "2.0", "Remote-write version sent (1.0 or 2.0); targets that only decode 1.0 (Prometheus 2.42, VictoriaMetrics 1.79) get the same load in 1.0.")
		vmBin        = fs.String("victoriametrics-bin", "/usr/bin/victoria-metrics", "VictoriaMetrics binary (apt-get install victoria-metrics).")
		receiverBin  = fs.String("receiver-bin", "bench/tmp/receiver", "Receiver binary (go build -tags dedupelabels -o bench/tmp/receiver ./cmd/receiver, as make bench-fleet does).")
		promBin      = fs.String("prometheus-bin", "/usr/bin/prometheus", "Prometheus binary.")
		workDir      = fs.String("work-dir", "bench/tmp/run", "Scratch directory for the servers' data (wiped per target).")
		resultsDir   = fs.String("results-dir", "bench/results", "Where to write <date>-<size>.json and README.md.")
		noRecord     = fs.Bool("no-record", false, "Print the table but write nothing to results-dir.")
		breakdown    = fs.String("heap-breakdown", "", "Only print the per-series breakdown of this heap profile (saved by --pprof-dir; its -memstats.txt is read if present) for --breakdown-series series, and exit.")
		bdSeries     = fs.Int("breakdown-series", 0, "Active series for --heap-breakdown.")
		bdRSS        = fs.Int64("breakdown-rss", 0, "RSS after the load in bytes for --heap-breakdown (0: not shown).")
		reportOnly   = fs.Bool("report-only", false, "Only regenerate results-dir/README.md and the PNGs from the JSON files there.")
		settle       = fs.Duration("settle", 2*time.Second, "Wait after the load before reading the RSS (\"RSS after load\"), for every target.")
		loadTimeout  = fs.Duration("load-timeout", 15*time.Minute, "Hard limit on each target's load phase.")
		timeout      = fs.Duration("timeout", 60*time.Minute, "Hard limit on the whole run.")
		label        = fs.String("label", "", "Record the run under this size label instead of --size (e.g. 200k-gogc50 for a variant).")
		pprofDir     = fs.String("pprof-dir", "", "If set, start the receiver with --web.enable-pprof and save a 20s CPU profile taken during the load and a heap profile after it here.")
		recvEnv      = fs.String("receiver-env", "", "Comma-separated VAR=value added to the receiver's environment (e.g. GOGC=50).")
		recvArgs     = fs.String("receiver-args", "", "Space-separated extra receiver flags.")
		clusterChurn = fs.Float64("cluster-churn", 0.03, "churn: fraction of clusters replaced per simulated hour.")
		seriesChurn  = fs.Float64("series-churn", 0.07, "churn: fraction of series replaced (new version label) per simulated hour.")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *breakdown != "" {
		ms := strings.TrimSuffix(*breakdown, "-heap.pb.gz") + "-memstats.txt"
		if err := writeHeapBreakdown(*receiverBin, *breakdown, ms, *bdSeries, *bdRSS, stdout); err != nil {
			fmt.Fprintf(stderr, "benchrun: %v\n", err)
			return 1
		}
		return 0
	}
	if *reportOnly {
		return writeREADMEAndPlots(*resultsDir, true, stderr)
	}
	presets, ok := sizes[*scen]
	if !ok {
		fmt.Fprintf(stderr, "benchrun: unknown scenario %q (have: %s)\n", *scen, strings.Join(scenario.Scenarios, ", "))
		return 2
	}
	preset, ok := presets[*size]
	if !ok && (*clusters == 0 || *perCluster == 0 || *rounds == 0) {
		names := slices.Sorted(maps.Keys(presets))
		fmt.Fprintf(stderr, "benchrun: unknown size %q for %s: use %s, or set --clusters, --series-per-cluster and --rounds\n", *size, *scen, strings.Join(names, ", "))
		return 2
	}
	preset.clusters = cmpOr(*clusters, preset.clusters)
	preset.perCluster = cmpOr(*perCluster, preset.perCluster)
	preset.rounds = cmpOr(*rounds, preset.rounds)
	stepSet := false
	fs.Visit(func(f *flag.Flag) { stepSet = stepSet || f.Name == "step" })
	if preset.step != 0 && !stepSet {
		*step = preset.step
	}
	if *protocol != "1.0" && *protocol != "2.0" {
		fmt.Fprintf(stderr, "benchrun: --protocol must be 1.0 or 2.0, not %q\n", *protocol)
		return 2
	}

	var tgs []scenario.Target
	const token = "bench-token"
	for name := range strings.SplitSeq(*targets, ",") {
		switch name {
		case "receiver":
			if _, err := os.Stat(*receiverBin); err != nil {
				fmt.Fprintf(stderr, "benchrun: receiver binary: %v (build it: go build -tags dedupelabels -o %s ./cmd/receiver)\n", err, *receiverBin)
				return 2
			}
			abs, _ := filepath.Abs(*receiverBin)
			rc := &scenario.Receiver{Bin: abs, Token: token, ExtraArgs: strings.Fields(*recvArgs)}
			if *recvEnv != "" {
				rc.Env = strings.Split(*recvEnv, ",")
			}
			if *pprofDir != "" {
				rc.ExtraArgs = append(rc.ExtraArgs, "--web.enable-pprof")
			}
			tgs = append(tgs, rc)
		case "prometheus":
			tgs = append(tgs, &scenario.Prometheus{Bin: *promBin})
		case "victoriametrics":
			if _, err := os.Stat(*vmBin); err != nil {
				fmt.Fprintf(stderr, "benchrun: SKIPPING victoriametrics: %v (apt-get install victoria-metrics, or --victoriametrics-bin)\n", err)
				continue
			}
			tgs = append(tgs, &scenario.VictoriaMetrics{Bin: *vmBin})
		default:
			fmt.Fprintf(stderr, "benchrun: unknown target %q (have: receiver, prometheus, victoriametrics)\n", name)
			return 2
		}
	}
	if len(tgs) == 0 {
		fmt.Fprintln(stderr, "benchrun: no target to run")
		return 2
	}
	absWork, err := filepath.Abs(*workDir)
	if err != nil {
		fmt.Fprintf(stderr, "benchrun: %v\n", err)
		return 2
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	var churnC, churnS float64
	if *scen == "churn" {
		churnC, churnS = *clusterChurn, *seriesChurn
	}
	if *pprofDir != "" {
		absP, err := filepath.Abs(*pprofDir)
		if err != nil {
			fmt.Fprintf(stderr, "benchrun: %v\n", err)
			return 2
		}
		*pprofDir = absP
	}
	rep, err := scenario.Run(ctx, scenario.Options{
		Scenario: *scen, ClusterChurnPerHour: churnC, SeriesChurnPerHour: churnS, PprofDir: *pprofDir,
		Size: cmpOrS(*label, *size), Clusters: preset.clusters, SeriesPerCluster: preset.perCluster, Rounds: preset.rounds,
		Concurrency: *concurrency, BatchSeries: *batch, Step: *step, Seed: *seed, Token: token, Protocol: *protocol,
		Targets: tgs, Repeat: *repeat, WorkDir: absWork, LoadTimeout: *loadTimeout, Settle: *settle, Log: stdout,
	})
	if err != nil {
		fmt.Fprintf(stderr, "benchrun: %v\n", err)
		if rep == nil {
			return 1
		}
	}
	rep.Command = "go run ./bench/cmd/benchrun " + strings.Join(args, " ")
	if *pprofDir != "" {
		summarizeProfiles(*pprofDir, *scen, cmpOrS(*label, *size), *receiverBin, rep, stderr)
	}
	rep.PrintTable(stdout)
	if *noRecord {
		return exitCode(rep, err)
	}
	path, werr := rep.WriteJSON(*resultsDir)
	if werr != nil {
		fmt.Fprintf(stderr, "benchrun: %v\n", werr)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s\n", path)
	png := strings.TrimSuffix(path, ".json") + ".png"
	if err := rep.WritePNG(png); err != nil {
		fmt.Fprintf(stderr, "benchrun: plot: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s\n", png)
	if c := writeREADME(*resultsDir, stderr); c != 0 {
		return c
	}
	return exitCode(rep, err)
}

func exitCode(rep *scenario.Report, err error) int {
	if err != nil || slices.ContainsFunc(rep.Results, func(r *scenario.TargetResult) bool { return r.Error != "" }) {
		return 1
	}
	return 0
}

func writeREADME(dir string, stderr io.Writer) int {
	return writeREADMEAndPlots(dir, false, stderr)
}

// writeREADMEAndPlots regenerates README.md from the newest report per
// scenario and size and, with plots, their PNGs.
func writeREADMEAndPlots(dir string, plots bool, stderr io.Writer) int {
	reps, err := scenario.LoadReports(dir)
	if err == nil && plots {
		for _, r := range reps {
			if perr := r.WritePNG(filepath.Join(dir, r.BaseName()+".png")); perr != nil {
				fmt.Fprintf(stderr, "benchrun: plot %s: %v\n", r.BaseName(), perr)
			}
		}
	}
	if err == nil {
		err = scenario.UpdateREADME(filepath.Join(dir, "README.md"), reps)
	}
	if err != nil {
		fmt.Fprintf(stderr, "benchrun: README: %v\n", err)
		return 1
	}
	return 0
}

func cmpOr(v, def int) int {
	if v != 0 {
		return v
	}
	return def
}

// summarizeProfiles writes the top 20 of `go tool pprof -top` next to each
// profile the run captured: CPU, and heap by in-use and by allocated space.
func summarizeProfiles(dir, scen, size, bin string, rep *scenario.Report, stderr io.Writer) {
	base := filepath.Join(dir, scen+"-"+size)
	// The heap profile is of the last receiver run.
	var rss int64
	for _, r := range rep.Results {
		if r.Name == "receiver" {
			rss = r.RSSBytes
		}
	}
	var bd bytes.Buffer
	if err := writeHeapBreakdown(bin, base+"-heap.pb.gz", base+"-memstats.txt", rep.Load.ActiveSeries, rss, &bd); err != nil {
		fmt.Fprintf(stderr, "benchrun: %v\n", err)
	} else if err := os.WriteFile(base+"-heap-breakdown.md", bd.Bytes(), 0o644); err != nil {
		fmt.Fprintf(stderr, "benchrun: %v\n", err)
	}
	for _, p := range []struct{ in, out, extra string }{
		{"-cpu.pb.gz", "-cpu-top20.txt", ""},
		{"-cpu.pb.gz", "-cpu-cum-top20.txt", "-cum"},
		{"-heap.pb.gz", "-heap-inuse-top20.txt", "-sample_index=inuse_space"},
		{"-heap.pb.gz", "-heap-alloc-top20.txt", "-sample_index=alloc_space"},
	} {
		args := []string{"tool", "pprof", "-top", "-nodecount=20"}
		if p.extra != "" {
			args = append(args, p.extra)
		}
		args = append(args, bin, base+p.in)
		out, err := exec.Command("go", args...).Output()
		if err != nil {
			fmt.Fprintf(stderr, "benchrun: pprof %s: %v\n", base+p.in, err)
			continue
		}
		if err := os.WriteFile(base+p.out, out, 0o644); err != nil {
			fmt.Fprintf(stderr, "benchrun: %v\n", err)
		}
	}
}

func cmpOrS(v, def string) string {
	if v != "" {
		return v
	}
	return def
}
