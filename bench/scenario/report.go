package scenario

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Report is the result of one scenario run, as committed in bench/results.
type Report struct {
	Scenario string          `json:"scenario"`
	Size     string          `json:"size"`
	Repeat   int             `json:"repeat"` // runs per target; figures are medians
	Date     time.Time       `json:"date"`
	Command  string          `json:"command"`
	Machine  Machine         `json:"machine"`
	Load     LoadSpec        `json:"load"`
	Results  []*TargetResult `json:"results"`
	Figures  []Figure        `json:"figures"`
}

// Figure is one measured quantity for both targets and their ratio.
type Figure struct {
	Name       string  `json:"name"`
	Unit       string  `json:"unit"`
	Better     string  `json:"better"` // "higher" or "lower"
	Receiver   float64 `json:"receiver"`
	Prometheus float64 `json:"prometheus"`
	Ratio      float64 `json:"ratio"` // receiver / prometheus; 0 if undefined
	// VictoriaMetrics and RatioVM (receiver / VictoriaMetrics) are set when
	// the run had a victoriametrics target.
	VictoriaMetrics float64 `json:"victoriametrics,omitempty"`
	RatioVM         float64 `json:"ratio_vm,omitempty"`
}

type figureDef struct {
	name, unit, better string
	get                func(*TargetResult) float64
}

var figureDefs = []figureDef{
	{"accepted samples/s (all rounds)", "samples/s", "higher", func(r *TargetResult) float64 { return r.Load.AcceptedPerSec }},
	{"accepted samples/s (round 0: series creation)", "samples/s", "higher", func(r *TargetResult) float64 { return r.Load.CreateAcceptedPerSec }},
	{"accepted samples/s (rounds 1+: steady)", "samples/s", "higher", func(r *TargetResult) float64 { return r.Load.SteadyAcceptedPerSec }},
	{"write latency p50 (all)", "ms", "lower", func(r *TargetResult) float64 { return r.Load.Latency.P50 * 1000 }},
	{"write latency p99 (all)", "ms", "lower", func(r *TargetResult) float64 { return r.Load.Latency.P99 * 1000 }},
	{"write latency p50 (steady)", "ms", "lower", func(r *TargetResult) float64 { return r.Load.SteadyLatency.P50 * 1000 }},
	{"write latency p99 (steady)", "ms", "lower", func(r *TargetResult) float64 { return r.Load.SteadyLatency.P99 * 1000 }},
	{"RSS after load", "MiB", "lower", func(r *TargetResult) float64 { return float64(r.RSSBytes) / (1 << 20) }},
	{"RSS per active series", "bytes", "lower", func(r *TargetResult) float64 { return r.RSSPerSeries }},
	{"RSS growth per active series (minus idle RSS)", "bytes", "lower", rssGrowthPerSeries},
	{"peak RSS during load (VmHWM)", "MiB", "lower", func(r *TargetResult) float64 { return float64(r.PeakRSSBytes) / (1 << 20) }},
	{"max RSS incl. shutdown/flush", "MiB", "lower", func(r *TargetResult) float64 { return float64(r.MaxRSSBytes) / (1 << 20) }},
	{"CPU per million samples", "cpu-s", "lower", func(r *TargetResult) float64 { return r.CPUPerMSamples }},
	{"block bytes per sample", "bytes", "lower", func(r *TargetResult) float64 { return r.Blocks.BytesPerSample }},
	{"block chunk bytes per sample", "bytes", "lower", func(r *TargetResult) float64 { return r.Blocks.ChunkBytesPerSample }},
	{"block index bytes per series", "bytes", "lower", func(r *TargetResult) float64 { return r.Blocks.IndexBytesPerSeries }},
	{"samples in blocks", "samples", "", func(r *TargetResult) float64 { return float64(r.Blocks.NumSamples) }},
	{"non-2xx requests", "requests", "lower", func(r *TargetResult) float64 {
		return float64(r.Load.Requests - r.Load.Codes["204"] - r.Load.Codes["200"])
	}},
	{"stop time (flush/snapshot + exit)", "s", "lower", func(r *TargetResult) float64 { return r.StopSeconds }},
}

func extra(k string) func(*TargetResult) float64 {
	return func(r *TargetResult) float64 {
		v, ok := r.Extra[k]
		if !ok {
			return math.NaN()
		}
		return v
	}
}

func extraMiB(k string) func(*TargetResult) float64 {
	return func(r *TargetResult) float64 { return extra(k)(r) / (1 << 20) }
}

func mib(get func(*TargetResult) int64) func(*TargetResult) float64 {
	return func(r *TargetResult) float64 { return float64(get(r)) / (1 << 20) }
}

// catchUpFleetSamples is issue 10's catch-up target: 10k clusters × 500
// series × 2h at 4m30s (27 points per series), to drain within 15 minutes.
const catchUpFleetSamples = 10_000 * 500 * 27

var (
	figAccepted  = figureDef{"accepted samples/s", "samples/s", "higher", func(r *TargetResult) float64 { return r.Load.AcceptedPerSec }}
	figP50       = figureDef{"write latency p50", "ms", "lower", func(r *TargetResult) float64 { return r.Load.Latency.P50 * 1000 }}
	figP99       = figureDef{"write latency p99", "ms", "lower", func(r *TargetResult) float64 { return r.Load.Latency.P99 * 1000 }}
	figRSS       = figureDef{"RSS after load", "MiB", "lower", mib(func(r *TargetResult) int64 { return r.RSSBytes })}
	figRSSSeries = figureDef{"RSS per active series", "bytes", "lower", func(r *TargetResult) float64 { return r.RSSPerSeries }}
	figPeak      = figureDef{"peak RSS during load (VmHWM)", "MiB", "lower", mib(func(r *TargetResult) int64 { return r.PeakRSSBytes })}
	figMax       = figureDef{"max RSS incl. shutdown/flush", "MiB", "lower", mib(func(r *TargetResult) int64 { return r.MaxRSSBytes })}
	figCPU       = figureDef{"CPU per million samples", "cpu-s", "lower", func(r *TargetResult) float64 { return r.CPUPerMSamples }}
	figBPS       = figureDef{"block bytes per sample", "bytes", "lower", func(r *TargetResult) float64 { return r.Blocks.BytesPerSample }}
	figChunkBPS  = figureDef{"block chunk bytes per sample", "bytes", "lower", func(r *TargetResult) float64 { return r.Blocks.ChunkBytesPerSample }}
	figIndexBPS  = figureDef{"block index bytes per sample", "bytes", "lower", func(r *TargetResult) float64 {
		return float64(r.Blocks.IndexBytes) / float64(max(r.Blocks.NumSamples, 1))
	}}
	figIndexSeries = figureDef{"block index bytes per series", "bytes", "lower", func(r *TargetResult) float64 { return r.Blocks.IndexBytesPerSeries }}
	figSamples     = figureDef{"samples in blocks", "samples", "", func(r *TargetResult) float64 { return float64(r.Blocks.NumSamples) }}
	figLost        = figureDef{"accepted samples missing from blocks", "samples", "lower", extra("lost_samples")}
	figNon2xx      = figureDef{"non-2xx requests", "requests", "lower", func(r *TargetResult) float64 {
		return float64(r.Load.Requests - r.Load.Codes["204"] - r.Load.Codes["200"])
	}}
	figStop = figureDef{"stop time (flush/snapshot + exit)", "s", "lower", func(r *TargetResult) float64 { return r.StopSeconds }}
)

// figureDefsFor returns the figures reported for a scenario.
func figureDefsFor(scenario string) []figureDef {
	switch scenario {
	case "catchup":
		return []figureDef{
			{"time to drain the backlog", "s", "lower", extra("drain_seconds")},
			figAccepted, figP50, figP99,
			{"peak RSS while draining (VmHWM)", "MiB", "lower", mib(func(r *TargetResult) int64 { return r.PeakRSSBytes })},
			figRSS, figRSSSeries, figCPU,
			{"samples sent", "samples", "", func(r *TargetResult) float64 { return float64(r.Load.Samples) }},
			figSamples, figLost, figNon2xx,
			{"EXTRAPOLATED drain of 10k clusters × 500 series × 2h at this rate", "min", "lower", func(r *TargetResult) float64 {
				return catchUpFleetSamples / r.Load.AcceptedPerSec / 60
			}},
			figStop,
		}
	case "churn":
		return []figureDef{
			figAccepted, figP50, figP99,
			{"head series after load", "series", "lower", extra("head_series")},
			figRSS,
			{"RSS per head series", "bytes", "lower", func(r *TargetResult) float64 {
				return float64(r.RSSBytes) / extra("head_series")(r)
			}},
			figPeak, figMax, figCPU,
			{"blocks", "blocks", "", func(r *TargetResult) float64 { return float64(r.Blocks.Count) }},
			{"block bytes", "MiB", "lower", func(r *TargetResult) float64 { return float64(r.Blocks.Bytes) / (1 << 20) }},
			{"series in blocks (sum over blocks)", "series", "", func(r *TargetResult) float64 { return float64(r.Blocks.NumSeries) }},
			figBPS, figChunkBPS, figIndexBPS, figIndexSeries, figSamples, figLost, figNon2xx, figStop,
		}
	case "restart":
		return []figureDef{
			figAccepted,
			{"accepted samples/s (rounds 1+: steady)", "samples/s", "higher", func(r *TargetResult) float64 { return r.Load.SteadyAcceptedPerSec }},
			figP50, figP99,
			{"write latency p99 (steady)", "ms", "lower", func(r *TargetResult) float64 { return r.Load.SteadyLatency.P99 * 1000 }},
			figCPU,
			{"steady RSS before the crash", "MiB", "lower", mib(func(r *TargetResult) int64 { return r.RSSBytes })},
			figRSSSeries,
			{"WAL replay: process start to /-/ready 200", "s", "lower", extra("replay_seconds")},
			{"peak RSS during replay (VmHWM)", "MiB", "lower", extraMiB("replay_peak_rss_bytes")},
			{"peak RSS during replay / steady RSS", "×", "lower", extra("replay_peak_over_steady")},
			{"RSS after replay", "MiB", "lower", extraMiB("rss_after_replay_bytes")},
			figSamples, figLost, figNon2xx, figStop,
		}
	case "storage":
		return []figureDef{
			figBPS, figChunkBPS, figIndexBPS, figIndexSeries,
			{"blocks", "blocks", "", func(r *TargetResult) float64 { return float64(r.Blocks.Count) }},
			{"block bytes", "MiB", "lower", func(r *TargetResult) float64 { return float64(r.Blocks.Bytes) / (1 << 20) }},
			{"block span", "h", "", func(r *TargetResult) float64 { return float64(r.Blocks.MaxTime-r.Blocks.MinTime) / 3.6e6 }},
			figSamples, figLost, figAccepted, figP99, figRSS, figPeak, figCPU, figNon2xx, figStop,
		}
	}
	return figureDefs
}

// rssGrowthPerSeries discounts the server's idle RSS (the first sample, taken
// once it was ready and before the load), which dominates at small sizes.
func rssGrowthPerSeries(r *TargetResult) float64 {
	if len(r.RSSOverTime) == 0 || r.Load == nil || r.Load.ActiveSeries == 0 {
		return math.NaN()
	}
	return float64(r.RSSBytes-r.RSSOverTime[0].RSS) / float64(r.Load.ActiveSeries)
}

func (r *Report) median(name string, get func(*TargetResult) float64) float64 {
	var v []float64
	for _, t := range r.Results {
		if t.Name == name && t.Load != nil && t.Error == "" {
			if x := get(t); !math.IsNaN(x) && !math.IsInf(x, 0) {
				v = append(v, x)
			}
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func (r *Report) computeRatios() {
	r.Figures = nil
	for _, d := range figureDefsFor(r.Scenario) {
		f := Figure{Name: d.name, Unit: d.unit, Better: d.better,
			Receiver: r.median("receiver", d.get), Prometheus: r.median("prometheus", d.get)}
		if f.Prometheus != 0 && !math.IsNaN(f.Prometheus) && !math.IsNaN(f.Receiver) {
			f.Ratio = f.Receiver / f.Prometheus
		}
		if r.has("victoriametrics") {
			f.VictoriaMetrics = r.median("victoriametrics", d.get)
			if f.VictoriaMetrics != 0 && !math.IsNaN(f.VictoriaMetrics) && !math.IsNaN(f.Receiver) {
				f.RatioVM = f.Receiver / f.VictoriaMetrics
			}
		}
		r.Figures = append(r.Figures, f)
	}
}

// has reports whether the run had a target named name.
func (r *Report) has(name string) bool {
	return slices.ContainsFunc(r.Results, func(t *TargetResult) bool { return t.Name == name })
}

// MarshalJSON-safe: NaN is not valid JSON, so unmeasured figures become 0.
func (r *Report) sanitize() {
	for i := range r.Figures {
		if math.IsNaN(r.Figures[i].Receiver) {
			r.Figures[i].Receiver = 0
		}
		if math.IsNaN(r.Figures[i].Prometheus) {
			r.Figures[i].Prometheus = 0
		}
		if math.IsNaN(r.Figures[i].VictoriaMetrics) {
			r.Figures[i].VictoriaMetrics = 0
		}
	}
}

// WriteJSON writes the report to dir/<date>-<size>.json and returns the path.
func (r *Report) WriteJSON(dir string) (string, error) {
	r.sanitize()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, r.BaseName()+".json")
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}

// BaseName is the results file name without extension.
func (r *Report) BaseName() string {
	if r.Scenario == "steady" { // steady keeps the names of its first recordings
		return fmt.Sprintf("%s-%s", r.Date.Format("2006-01-02"), r.Size)
	}
	return fmt.Sprintf("%s-%s-%s", r.Date.Format("2006-01-02"), r.Scenario, r.Size)
}

// PrintTable writes the side-by-side table.
func (r *Report) PrintTable(w io.Writer) {
	fmt.Fprintf(w, "\n%s, %d active series (%d clusters × %d), %d rounds, median of %d run(s) per target\n",
		r.Scenario, r.Load.ActiveSeries, r.Load.Clusters, r.Load.SeriesPerCluster, r.Load.Rounds, r.Repeat)
	vm := r.has("victoriametrics")
	if vm {
		fmt.Fprintf(w, "%-72s %12s %12s %12s %8s %8s\n", "figure", "receiver", "prometheus", "victoriam.", "r/prom", "r/vm")
	} else {
		fmt.Fprintf(w, "%-72s %12s %12s %8s\n", "figure", "receiver", "prometheus", "ratio")
	}
	for _, f := range r.Figures {
		if vm {
			fmt.Fprintf(w, "%-72s %12s %12s %12s %8s %8s\n", f.Name+" ["+f.Unit+"]", num(f.Receiver), num(f.Prometheus), num(f.VictoriaMetrics), ratio(f.Ratio), ratio(f.RatioVM))
			continue
		}
		fmt.Fprintf(w, "%-72s %12s %12s %8s\n", f.Name+" ["+f.Unit+"]", num(f.Receiver), num(f.Prometheus), ratio(f.Ratio))
	}
	for _, t := range r.Results {
		if t.Error != "" {
			fmt.Fprintf(w, "%s (repeat %d) error: %s\n", t.Name, t.Repeat, t.Error)
		}
	}
}

func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v == 0:
		return "0"
	case math.Abs(v) >= 1000:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func ratio(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v)
}

// Machine describes where a benchmark ran.
type Machine struct {
	CPUs       int    `json:"cpus"`
	CPUModel   string `json:"cpu_model"`
	MemTotalGB int64  `json:"mem_total_gib"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"go_version"`
	GOARCH     string `json:"goarch"`
}

// DescribeMachine reads nproc, /proc/cpuinfo, /proc/meminfo and the kernel release.
func DescribeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), GOARCH: runtime.GOARCH}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			var kb int64
			if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
				m.MemTotalGB = kb >> 20
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// LoadReports reads every report in dir, newest first per (scenario, size)
// only the latest is kept, ordered by active series.
func LoadReports(dir string) ([]*Report, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	latest := map[string]*Report{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var r Report
		if err := json.Unmarshal(b, &r); err != nil || r.Scenario == "" {
			continue // not a report
		}
		r.computeRatios() // figures added since the run are derived from its raw results
		r.sanitize()
		k := r.Scenario + "/" + r.Size
		if old, ok := latest[k]; !ok || r.Date.After(old.Date) {
			latest[k] = &r
		}
	}
	out := make([]*Report, 0, len(latest))
	for _, r := range latest {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *Report) int {
		if c := slices.Index(Scenarios, a.Scenario) - slices.Index(Scenarios, b.Scenario); c != 0 {
			return c
		}
		if c := a.Load.ActiveSeries - b.Load.ActiveSeries; c != 0 {
			return c
		}
		return strings.Compare(a.Size, b.Size) // a stable order for the generated README
	})
	return out, nil
}
