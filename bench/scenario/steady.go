// Package scenario runs fleet benchmark scenarios against the phonehome
// receiver and, under the identical load in the same run, against Prometheus,
// and reports each figure side by side with the ratio receiver/Prometheus.
//
// Only the steady-fleet scenario exists so far. Further scenarios (catch-up,
// churn, restart, storage; issue 10) reuse Target, the process sampling and
// the Report format.
package scenario

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/phonehome/phonehome/bench"
	"github.com/phonehome/phonehome/bench/fleet"
)

// Options configures a scenario run.
type Options struct {
	Scenario         string // steady, catchup, churn, restart or storage
	Size             string // a label for the results, e.g. "100k"
	Clusters         int
	SeriesPerCluster int
	Rounds           int
	Concurrency      int
	BatchSeries      int
	Step             time.Duration // simulated time between rounds
	Seed             uint64
	Token            string
	// Protocol is the remote-write version sent ("1.0" or "2.0"; default
	// "1.0"). Targets that cannot decode it (protocolsTarget) get the same
	// load in 1.0.
	Protocol    string
	Targets     []Target      // run one after another, in this order
	Repeat      int           // run the target sequence this many times (medians are reported)
	WorkDir     string        // a fresh subdirectory per target is made here
	LoadTimeout time.Duration // hard limit on each target's load phase
	Settle      time.Duration // wait after the load before reading steady RSS
	Log         io.Writer

	// PprofDir, if set, receives a CPU profile of the receiver taken during
	// the load (PprofSeconds, default 20) and a heap profile after it.
	PprofDir     string
	PprofSeconds int

	// Churn: fractions of clusters and of series replaced per simulated hour.
	ClusterChurnPerHour, SeriesChurnPerHour float64
}

// LoadSpec is the load every target received.
type LoadSpec struct {
	Clusters         int       `json:"clusters"`
	SeriesPerCluster int       `json:"series_per_cluster"`
	ActiveSeries     int       `json:"active_series"`
	Templates        int       `json:"templates"`
	Rounds           int       `json:"rounds"`
	Concurrency      int       `json:"concurrency"`
	BatchSeries      int       `json:"batch_series"`
	Step             string    `json:"step"`
	Seed             uint64    `json:"seed"`
	FirstTimestamp   time.Time `json:"first_timestamp"`
	RequestBodyBytes int64     `json:"request_body_bytes"`
	// Protocol is the remote-write version of the run ("" in older results:
	// 1.0); a target that cannot decode it got 1.0 (TargetResult.Protocol).
	Protocol string `json:"protocol,omitempty"`
	// Churn only: replaced fractions per simulated hour and the distinct
	// series the rounds create.
	ClusterChurnPerHour float64 `json:"cluster_churn_per_hour,omitempty"`
	SeriesChurnPerHour  float64 `json:"series_churn_per_hour,omitempty"`
	DistinctSeries      int     `json:"distinct_series,omitempty"`
}

// TargetResult is what one target did under the load.
type TargetResult struct {
	Name   string `json:"name"`
	Repeat int    `json:"repeat"`
	// Protocol is the remote-write version this target was sent.
	Protocol string        `json:"protocol,omitempty"`
	Version  string        `json:"version"`
	Command  []string      `json:"command"`
	Error    string        `json:"error,omitempty"`
	Load     *fleet.Result `json:"load"`

	RSSBytes       int64      `json:"rss_bytes"`      // VmRSS after the load and Settle
	PeakRSSBytes   int64      `json:"peak_rss_bytes"` // VmHWM after the load
	MaxRSSBytes    int64      `json:"max_rss_bytes"`  // highest sampled VmRSS, shutdown included
	RSSPerSeries   float64    `json:"rss_bytes_per_active_series"`
	CPUSeconds     float64    `json:"cpu_seconds"` // user+system during the load
	CPUPerMSamples float64    `json:"cpu_seconds_per_million_samples"`
	StopSeconds    float64    `json:"stop_seconds"` // SIGTERM (and snapshot) to exit
	Blocks         Blocks     `json:"blocks"`
	RSSOverTime    []RSSPoint `json:"rss_over_time"`

	// Timeline is throughput and latency over time, on the same clock as
	// RSSOverTime (seconds since the server was first measured).
	Timeline []TimelinePoint `json:"timeline,omitempty"`
	// HeadSeriesOverTime (churn) is prometheus_tsdb_head_series over time.
	HeadSeriesOverTime []SeriesPoint `json:"head_series_over_time,omitempty"`
	// Extra holds the scenario's own figures (see figureDefsFor).
	Extra map[string]float64 `json:"extra,omitempty"`
}

// Scenarios are the scenario names Run knows, in report order.
var Scenarios = []string{"steady", "catchup", "churn", "restart", "storage"}

// Run runs scenario o.Scenario: every target gets the same byte-identical
// rounds of one point per series, sent as fast as it accepts them (see the
// README for what each scenario adds).
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Scenario == "" {
		o.Scenario = "steady"
	}
	if !slices.Contains(Scenarios, o.Scenario) {
		return nil, fmt.Errorf("unknown scenario %q", o.Scenario)
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	tmpl, err := fleet.LoadTemplateFiles(bench.FederateSample, bench.TelemetryAllowlist)
	if err != nil {
		return nil, err
	}
	f, err := fleet.New(tmpl, o.Clusters, o.SeriesPerCluster, o.Seed)
	if err != nil {
		return nil, err
	}
	if o.ClusterChurnPerHour > 0 || o.SeriesChurnPerHour > 0 {
		f = f.WithChurn(o.ClusterChurnPerHour, o.SeriesChurnPerHour)
	}
	fo := fleet.Options{
		Token: o.Token, Rounds: o.Rounds, Step: o.Step,
		Start:       FirstTimestamp(time.Now(), o.Rounds, o.Step),
		Concurrency: o.Concurrency, BatchSeries: o.BatchSeries,
		// The 10k-cluster catch-up needs 6.5 GB of bodies; with the
		// receiver's ~8 GB that still fits a 23 GiB machine.
		MaxPreEncodedBytes: 8 << 30,
	}
	if o.Protocol == "" {
		o.Protocol = fleet.ProtocolV1
	}
	// The bodies of each protocol a target needs, encoded once before any
	// target starts.
	bodies := map[string][][][]byte{}
	var bodyBytes int64
	for _, tg := range o.Targets {
		p := targetProtocol(tg, o.Protocol)
		if bodies[p] != nil {
			continue
		}
		fmt.Fprintf(o.Log, "encoding %d rounds × %d series, remote-write %s ...\n", o.Rounds, f.ActiveSeries(), p)
		t := time.Now()
		po := fo
		po.Protocol = p
		b, err := fleet.EncodeAll(ctx, f, po)
		if err != nil {
			return nil, err
		}
		var n int64
		for _, r := range b {
			for _, x := range r {
				n += int64(len(x))
			}
		}
		if p == o.Protocol || bodyBytes == 0 {
			bodyBytes = n
		}
		fmt.Fprintf(o.Log, "encoded %d MiB in %s\n", n>>20, time.Since(t).Round(time.Millisecond))
		bodies[p] = b
	}

	rep := &Report{
		Scenario: o.Scenario,
		Size:     o.Size,
		Repeat:   max(1, o.Repeat),
		Date:     time.Now().UTC(),
		Machine:  DescribeMachine(),
		Load: LoadSpec{
			Clusters: f.Clusters(), SeriesPerCluster: f.SeriesPerCluster(), ActiveSeries: f.ActiveSeries(),
			Templates: len(tmpl), Rounds: o.Rounds, Concurrency: o.Concurrency, BatchSeries: o.BatchSeries,
			Step: o.Step.String(), Seed: o.Seed, FirstTimestamp: fo.Start.UTC(), RequestBodyBytes: bodyBytes, Protocol: o.Protocol,
			ClusterChurnPerHour: o.ClusterChurnPerHour, SeriesChurnPerHour: o.SeriesChurnPerHour,
			DistinctSeries: f.DistinctSeries(o.Rounds, o.Step.Milliseconds()),
		},
	}
	// Interleaving the targets (P R P R ...) spreads slow phases of a shared
	// machine over both, and the medians damp them.
	for i := range max(1, o.Repeat) {
		for _, tg := range o.Targets {
			if ctx.Err() != nil {
				rep.computeRatios()
				return rep, ctx.Err()
			}
			fmt.Fprintf(o.Log, "== %s (%s), repeat %d\n", tg.Name(), tg.Version(), i)
			to := fo
			to.Protocol = targetProtocol(tg, o.Protocol)
			to.Bodies = bodies[to.Protocol]
			res := runTarget(ctx, tg, f, to, o)
			res.Repeat, res.Protocol = i, to.Protocol
			if res.Error != "" {
				fmt.Fprintf(o.Log, "%s: %s\n", tg.Name(), res.Error)
			}
			rep.Results = append(rep.Results, res)
		}
	}
	rep.computeRatios()
	return rep, nil
}

// targetProtocol is the remote-write version tg is sent: want, unless tg
// cannot decode it, then the first it can.
func targetProtocol(tg Target, want string) string {
	pt, ok := tg.(protocolsTarget)
	if !ok || slices.Contains(pt.Protocols(), want) {
		return want
	}
	return pt.Protocols()[0]
}

// blockRange is the 2h block range both TSDBs align blocks to.
const blockRange = 2 * time.Hour

// FirstTimestamp places all rounds inside the previous 2h-aligned block
// range when they fit, so that both servers write exactly one block and block
// sizes compare like for like; otherwise the rounds end about now.
func FirstTimestamp(now time.Time, rounds int, step time.Duration) time.Time {
	span := time.Duration(rounds-1) * step
	if span < blockRange-2*time.Minute {
		return now.Truncate(blockRange).Add(-blockRange + time.Minute)
	}
	return now.Add(-span - time.Minute).Truncate(time.Second)
}
