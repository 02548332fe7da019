// Command fleetstart runs the catch-up scenario with real forwarders started
// together (bench/fleetstart), once with the default jitter and once with
// jitter off, each against a fresh receiver, and prints what the receiver
// saw: requests in flight at once and write latency.
//
//	go build -tags dedupelabels -o bench/tmp/receiver ./cmd/receiver
//	go run ./bench/cmd/fleetstart --clusters=200
//
// It must run from the repository root.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/phonehome/phonehome/bench/fleetstart"
	"github.com/phonehome/phonehome/bench/scenario"
	"github.com/phonehome/phonehome/forward"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fleetstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		clusters   = fs.Int("clusters", 200, "Forwarders (one per cluster).")
		perCluster = fs.Int("series-per-cluster", 500, "Series each forwarder collects.")
		backlog    = fs.Int("backlog", 27, "Collections queued during the outage (27 = 2h at 4m30s).")
		interval   = fs.Duration("interval", 270*time.Second, "The forwarders' --interval.")
		modes      = fs.String("modes", "jitter,off", "Runs, in order: jitter (the default 10 %) and/or off (forward.NoJitter).")
		receiver   = fs.String("receiver-bin", "bench/tmp/receiver", "Receiver binary.")
		workDir    = fs.String("work-dir", "bench/tmp/fleetstart-run", "Scratch directory (wiped per run).")
		timeout    = fs.Duration("timeout", 15*time.Minute, "Hard limit on the whole run.")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	bin, err := filepath.Abs(*receiver)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		fmt.Fprintf(stderr, "fleetstart: receiver binary: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	const token = "bench-token"
	fmt.Fprintf(stdout, "%d forwarders × %d series, backlog %d collections each (%d samples in all), --interval %s\n\n",
		*clusters, *perCluster, *backlog, *clusters**perCluster*(*backlog+1), *interval)
	fmt.Fprintln(stdout, "| jitter | requests | failed | peak in flight | p50 | p99 | max | last answer after | prefill |")
	fmt.Fprintln(stdout, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, mode := range strings.Split(*modes, ",") {
		j := 0.0 // the default
		switch mode {
		case "jitter":
		case "off":
			j = forward.NoJitter
		default:
			fmt.Fprintf(stderr, "fleetstart: unknown mode %q\n", mode)
			return 2
		}
		dir := filepath.Join(*workDir, mode)
		_ = os.RemoveAll(dir)
		if err := os.MkdirAll(filepath.Join(dir, "receiver"), 0o755); err != nil {
			fmt.Fprintf(stderr, "fleetstart: %v\n", err)
			return 1
		}
		res, err := runOnce(ctx, &scenario.Receiver{Bin: bin, Token: token}, dir, fleetstart.Options{
			Clusters: *clusters, SeriesPerCluster: *perCluster, Backlog: *backlog,
			Interval: *interval, Jitter: j, Seed: 1,
		}, token)
		if err != nil {
			fmt.Fprintf(stderr, "fleetstart: %s: %v\n", mode, err)
			return 1
		}
		fmt.Fprintf(stdout, "| %s | %d | %d | %d | %s | %s | %s | %s | %s |\n", mode, res.Requests, res.Failed, res.PeakInFlight,
			ms(res.P50), ms(res.P99), ms(res.Max), res.Drained.Round(100*time.Millisecond), res.PrefillDuration.Round(time.Second))
		fmt.Fprintf(stderr, "%s: peak in flight per second:", mode)
		for i := 0; i < len(res.InFlightBy100ms); i += 10 {
			p := int64(0)
			for _, v := range res.InFlightBy100ms[i:min(i+10, len(res.InFlightBy100ms))] {
				p = max(p, v)
			}
			fmt.Fprintf(stderr, " %d", p)
		}
		fmt.Fprintln(stderr)
	}
	return 0
}

func runOnce(ctx context.Context, rc *scenario.Receiver, dir string, o fleetstart.Options, token string) (*fleetstart.Result, error) {
	recv, err := rc.Start(ctx, filepath.Join(dir, "receiver"), nil)
	if err != nil {
		return nil, err
	}
	defer func() { _, _, _ = recv.Finish(context.Background()) }()
	o.BaseURL = strings.TrimSuffix(recv.WriteURL, "/api/v1/write")
	o.Dir = filepath.Join(dir, "queues")
	if o.TokenFile, err = fleetstart.WriteTokenFile(dir, token); err != nil {
		return nil, err
	}
	return fleetstart.Run(ctx, o)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
