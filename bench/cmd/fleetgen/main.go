// Command fleetgen simulates a fleet of clusters sending telemetry over
// Prometheus remote-write 1.0 and reports throughput, latency and status codes.
//
//	fleetgen --url=http://127.0.0.1:9291/api/v1/write --token-file=token \
//	  --clusters=200 --series-per-cluster=500 --rounds=10 --out=result.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/phonehome/phonehome/bench"
	"github.com/phonehome/phonehome/bench/fleet"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fleetgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		url         = fs.String("url", "http://127.0.0.1:9291/api/v1/write", "Remote-write 1.0 endpoint.")
		tokenFile   = fs.String("token-file", "", "File holding the bearer token (optional).")
		clusters    = fs.Int("clusters", 100, "Simulated clusters.")
		perCluster  = fs.Int("series-per-cluster", 500, "Series per cluster.")
		rounds      = fs.Int("rounds", 0, "Rounds to send, one point per series each (default 5, or duration/interval).")
		duration    = fs.Duration("duration", 10*time.Minute, "Hard limit on the run's wall time.")
		interval    = fs.Duration("interval", 0, "Wall time between round starts; 0 sends as fast as the server accepts.")
		step        = fs.Duration("step", 270*time.Second, "Simulated time between rounds (sample timestamp spacing).")
		concurrency = fs.Int("concurrency", 8, "Parallel requests.")
		batch       = fs.Int("batch-series", 500, "Max series per request (a request never spans clusters).")
		seed        = fs.Uint64("seed", 1, "Seed; the same seed sends the same series and values.")
		fixture     = fs.String("fixture", "", "A /federate response to take series shapes from (default: the embedded bench/testdata/federate-sample.prom).")
		allowlist   = fs.String("allowlist", "", "Selectors that pick template series (default: the embedded telemetry allowlist; 'none' keeps all).")
		out         = fs.String("out", "", "Write the JSON result here (optional).")
		preEncode   = fs.Bool("pre-encode", true, "Encode every request before the first round (up to 4 GiB), so the generator does not compete with the server for CPU.")
		quiet       = fs.Bool("quiet", false, "Do not print per-round progress.")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fleetgen: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *rounds == 0 {
		*rounds = 5
		if *interval > 0 {
			*rounds = max(1, int(*duration / *interval))
		}
	}
	token := ""
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "fleetgen: %v\n", err)
			return 2
		}
		token = strings.TrimSpace(string(b))
	}
	expo, allow := bench.FederateSample, bench.TelemetryAllowlist
	var err error
	if *fixture != "" {
		if expo, err = os.ReadFile(*fixture); err != nil {
			fmt.Fprintf(stderr, "fleetgen: %v\n", err)
			return 2
		}
	}
	switch *allowlist {
	case "":
	case "none":
		allow = nil
	default:
		if allow, err = os.ReadFile(*allowlist); err != nil {
			fmt.Fprintf(stderr, "fleetgen: %v\n", err)
			return 2
		}
	}
	tmpl, err := fleet.LoadTemplateFiles(expo, allow)
	if err != nil {
		fmt.Fprintf(stderr, "fleetgen: templates: %v\n", err)
		return 2
	}
	f, err := fleet.New(tmpl, *clusters, *perCluster, *seed)
	if err != nil {
		fmt.Fprintf(stderr, "fleetgen: %v\n", err)
		return 2
	}

	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	fmt.Fprintf(stdout, "fleetgen: %d clusters × %d series = %d active series (%d templates), %d rounds, concurrency %d, batch %d\n",
		f.Clusters(), f.SeriesPerCluster(), f.ActiveSeries(), len(tmpl), *rounds, *concurrency, *batch)
	opts := fleet.Options{
		URL: *url, Token: token, Rounds: *rounds, Interval: *interval, Step: *step,
		Concurrency: *concurrency, BatchSeries: *batch, PreEncode: *preEncode,
	}
	if !*quiet {
		opts.OnRound = func(r fleet.RoundResult) {
			fmt.Fprintf(stdout, "round %3d: %8d samples in %7.2fs (%10.0f/s), accepted %d, lag %s\n",
				r.Round, r.Samples, r.Duration.Seconds(), float64(r.Accepted)/max(r.Duration.Seconds(), 1e-9), r.Accepted, r.Lag.Round(time.Millisecond))
		}
	}
	res, err := fleet.Run(ctx, f, opts)
	if err != nil {
		fmt.Fprintf(stderr, "fleetgen: %v\n", err)
		return 1
	}
	fleet.PrintSummary(stdout, res)
	if *out != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err == nil {
			err = os.WriteFile(*out, append(b, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "fleetgen: write result: %v\n", err)
			return 1
		}
	}
	if res.Aborted != "" && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return 1
	}
	if res.Accepted < res.Samples {
		return 1
	}
	return 0
}
