// Command benchrun runs a fleet benchmark scenario against the phonehome
// receiver and Debian's Prometheus under identical load, one after the other,
// prints a side-by-side table and records the results in bench/results.
//
//	go build -o bench/tmp/receiver ./cmd/receiver
//	go run ./bench/cmd/benchrun --size=100k
//	go run ./bench/cmd/benchrun --size=1m
//
// It must run from the repository root (paths default to bench/...).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/phonehome/phonehome/bench/scenario"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// size presets: clusters × 500 series, the shape of issue 10's steady fleet.
var sizes = map[string]struct{ clusters, perCluster, rounds int }{
	"smoke": {10, 500, 3},
	"100k":  {200, 500, 20},
	"1m":    {2000, 500, 6},
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		scen        = fs.String("scenario", "steady", "Scenario to run (only steady exists so far).")
		size        = fs.String("size", "100k", "Size preset: smoke, 100k or 1m (clusters × 500 series).")
		clusters    = fs.Int("clusters", 0, "Override the preset's clusters.")
		perCluster  = fs.Int("series-per-cluster", 0, "Override the preset's series per cluster.")
		rounds      = fs.Int("rounds", 0, "Override the preset's rounds.")
		concurrency = fs.Int("concurrency", 8, "Parallel requests.")
		batch       = fs.Int("batch-series", 500, "Max series per request.")
		step        = fs.Duration("step", 270*time.Second, "Simulated time between rounds.")
		seed        = fs.Uint64("seed", 1, "Load seed (the same for every target).")
		repeat      = fs.Int("repeat", 1, "Run the targets this many times, interleaved; figures are medians.")
		targets     = fs.String("targets", "prometheus,receiver", "Targets, run in this order.")
		receiverBin = fs.String("receiver-bin", "bench/tmp/receiver", "Receiver binary (go build -o bench/tmp/receiver ./cmd/receiver).")
		promBin     = fs.String("prometheus-bin", "/usr/bin/prometheus", "Prometheus binary.")
		workDir     = fs.String("work-dir", "bench/tmp/run", "Scratch directory for the servers' data (wiped per target).")
		resultsDir  = fs.String("results-dir", "bench/results", "Where to write <date>-<size>.json and README.md.")
		noRecord    = fs.Bool("no-record", false, "Print the table but write nothing to results-dir.")
		reportOnly  = fs.Bool("report-only", false, "Only regenerate results-dir/README.md from the JSON files there.")
		loadTimeout = fs.Duration("load-timeout", 15*time.Minute, "Hard limit on each target's load phase.")
		timeout     = fs.Duration("timeout", 60*time.Minute, "Hard limit on the whole run.")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *reportOnly {
		return writeREADME(*resultsDir, stderr)
	}
	if *scen != "steady" {
		fmt.Fprintf(stderr, "benchrun: unknown scenario %q (have: steady)\n", *scen)
		return 2
	}
	preset, ok := sizes[*size]
	if !ok && (*clusters == 0 || *perCluster == 0 || *rounds == 0) {
		fmt.Fprintf(stderr, "benchrun: unknown size %q: use smoke, 100k, 1m, or set --clusters, --series-per-cluster and --rounds\n", *size)
		return 2
	}
	preset.clusters = cmpOr(*clusters, preset.clusters)
	preset.perCluster = cmpOr(*perCluster, preset.perCluster)
	preset.rounds = cmpOr(*rounds, preset.rounds)

	var tgs []scenario.Target
	const token = "bench-token"
	for name := range strings.SplitSeq(*targets, ",") {
		switch name {
		case "receiver":
			if _, err := os.Stat(*receiverBin); err != nil {
				fmt.Fprintf(stderr, "benchrun: receiver binary: %v (build it: go build -o %s ./cmd/receiver)\n", err, *receiverBin)
				return 2
			}
			abs, _ := filepath.Abs(*receiverBin)
			tgs = append(tgs, &scenario.Receiver{Bin: abs, Token: token})
		case "prometheus":
			tgs = append(tgs, &scenario.Prometheus{Bin: *promBin})
		default:
			fmt.Fprintf(stderr, "benchrun: unknown target %q (have: receiver, prometheus)\n", name)
			return 2
		}
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

	rep, err := scenario.Steady(ctx, scenario.SteadyOptions{
		Size: *size, Clusters: preset.clusters, SeriesPerCluster: preset.perCluster, Rounds: preset.rounds,
		Concurrency: *concurrency, BatchSeries: *batch, Step: *step, Seed: *seed, Token: token,
		Targets: tgs, Repeat: *repeat, WorkDir: absWork, LoadTimeout: *loadTimeout, Settle: 2 * time.Second, Log: stdout,
	})
	if err != nil {
		fmt.Fprintf(stderr, "benchrun: %v\n", err)
		if rep == nil {
			return 1
		}
	}
	rep.Command = "go run ./bench/cmd/benchrun " + strings.Join(args, " ")
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
	reps, err := scenario.LoadReports(dir)
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
