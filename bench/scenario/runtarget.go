package scenario

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/phonehome/phonehome/bench/fleet"
)

// SeriesPoint is a head series count at T (the RSS clock).
type SeriesPoint struct {
	T      float64 `json:"t_s"`
	Series float64 `json:"series"`
}

// TimelinePoint is the load in one window: accepted samples per second
// (by completion time) and the latency of the requests sent in it.
type TimelinePoint struct {
	T             float64 `json:"t_s"` // window end, seconds since the server was first measured
	SamplesPerSec float64 `json:"samples_per_s"`
	P50ms         float64 `json:"p50_ms"`
	P99ms         float64 `json:"p99_ms"`
}

// timeline buckets events into about 80 windows of at least 1s; offset is
// when the load started on the RSS clock.
func timeline(evs []fleet.Event, offset float64) []TimelinePoint {
	if len(evs) == 0 {
		return nil
	}
	var end time.Duration
	for _, e := range evs {
		end = max(end, e.Start+e.Latency)
	}
	w := max(time.Second, end/80)
	n := int(end/w) + 1
	acc := make([]float64, n)
	lats := make([][]float64, n)
	for _, e := range evs {
		acc[int((e.Start+e.Latency)/w)] += float64(e.Accepted)
		k := int(e.Start / w)
		lats[k] = append(lats[k], e.Latency.Seconds()*1000)
	}
	out := make([]TimelinePoint, 0, n)
	for k := range n {
		p := TimelinePoint{T: offset + float64(k+1)*w.Seconds(), SamplesPerSec: acc[k] / w.Seconds()}
		if l := lats[k]; len(l) > 0 {
			slices.Sort(l)
			p.P50ms = l[len(l)/2]
			p.P99ms = l[min(len(l)-1, int(0.99*float64(len(l))))]
		}
		out = append(out, p)
	}
	return out
}

func (r *TargetResult) setExtra(k string, v float64) {
	if r.Extra == nil {
		r.Extra = map[string]float64{}
	}
	r.Extra[k] = v
}

// runTarget starts tg in a fresh directory, sends the load, measures, and
// (restart scenario) kills it with SIGKILL and measures the WAL replay of a
// second process on the same data. It then makes the data blocks and checks
// that they hold every accepted sample.
func runTarget(ctx context.Context, tg Target, f *fleet.Fleet, fo fleet.Options, o Options) *TargetResult {
	res := &TargetResult{Name: tg.Name(), Version: tg.Version()}
	dir := filepath.Join(o.WorkDir, tg.Name())
	if err := os.RemoveAll(dir); err != nil {
		res.Error = err.Error()
		return res
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		res.Error = err.Error()
		return res
	}
	t0 := time.Now()
	run, err := tg.Start(ctx, dir, nil)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer func() { run.srv.kill() }() // a no-op once Finish stopped it
	res.Command = run.Args
	res.setExtra("start_seconds", time.Since(t0).Seconds())
	pid := run.srv.pid()
	smp := startSampler(pid, 250*time.Millisecond, 0)
	if m, err := readProcMem(pid); err == nil {
		res.setExtra("idle_rss_bytes", float64(m.rss))
	}

	cpu0, _ := cpuSeconds(pid)
	fo.URL = run.WriteURL
	fo.OnRound = func(r fleet.RoundResult) {
		if fo.Rounds <= 30 || r.Round%10 == 0 || r.Round == fo.Rounds-1 {
			fmt.Fprintf(o.Log, "  round %3d: %8d samples in %6.2fs = %9.0f/s accepted\n",
				r.Round, r.Samples, r.Duration.Seconds(), float64(r.Accepted)/max(r.Duration.Seconds(), 1e-9))
		}
	}
	loadStart := time.Since(smp.start).Seconds()
	lctx, cancel := context.WithTimeout(ctx, o.LoadTimeout)
	var prof chan error
	if o.PprofDir != "" && tg.Name() == "receiver" {
		prof = make(chan error, 1)
		go func() {
			secs := cmp.Or(o.PprofSeconds, 20)
			prof <- fetch(lctx, run.srv.baseURL+fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs),
				filepath.Join(o.PprofDir, fmt.Sprintf("%s-%s-cpu.pb.gz", o.Scenario, o.Size)))
		}()
	}
	var headc chan []SeriesPoint
	if o.Scenario == "churn" {
		headc = make(chan []SeriesPoint, 1)
		go func() {
			var pts []SeriesPoint
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				if n, err := headSeries(lctx, run.srv.baseURL, ""); err == nil {
					pts = append(pts, SeriesPoint{T: time.Since(smp.start).Seconds(), Series: n})
				}
				select {
				case <-lctx.Done():
					headc <- pts
					return
				case <-t.C:
				}
			}
		}()
	}
	load, err := fleet.Run(lctx, f, fo)
	if prof != nil {
		if perr := <-prof; perr != nil {
			fmt.Fprintf(o.Log, "cpu profile: %v\n", perr)
		}
		if perr := fetch(ctx, run.srv.baseURL+"/debug/pprof/heap?gc=1",
			filepath.Join(o.PprofDir, fmt.Sprintf("%s-%s-heap.pb.gz", o.Scenario, o.Size))); perr != nil {
			fmt.Fprintf(o.Log, "heap profile: %v\n", perr)
		}
		// The text form ends with the runtime's MemStats: how much of the
		// RSS is live heap, free heap not yet returned, stacks and metadata.
		if perr := fetchMemStats(ctx, run.srv.baseURL,
			filepath.Join(o.PprofDir, fmt.Sprintf("%s-%s-memstats.txt", o.Scenario, o.Size))); perr != nil {
			fmt.Fprintf(o.Log, "heap memstats: %v\n", perr)
		}
	}
	cancel()
	if headc != nil {
		res.HeadSeriesOverTime = <-headc
	}
	cpu1, _ := cpuSeconds(pid)
	res.Load = load
	res.CPUSeconds = cpu1 - cpu0
	if load != nil {
		res.Timeline = timeline(load.Events, loadStart)
		if load.Accepted > 0 {
			res.CPUPerMSamples = res.CPUSeconds / (float64(load.Accepted) / 1e6)
		}
		res.setExtra("drain_seconds", load.End.Sub(load.Start).Seconds())
	}
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}

	select {
	case <-time.After(o.Settle):
	case <-ctx.Done():
	}
	if m, err := readProcMem(pid); err == nil {
		res.RSSBytes, res.PeakRSSBytes = m.rss, m.hwm
		res.RSSPerSeries = float64(m.rss) / float64(f.ActiveSeries())
	} else {
		errs = append(errs, fmt.Errorf("read memory: %w", err))
	}
	if o.Scenario == "churn" {
		if n, err := headSeries(ctx, run.srv.baseURL, tg.Name()); err == nil {
			res.setExtra("head_series", n)
		}
	}

	if o.Scenario == "restart" && ctx.Err() == nil {
		// A crash: SIGKILL leaves the head in the WAL (a graceful receiver
		// stop would flush it to a block and start with nothing to replay).
		res.setExtra("kill_at_s", time.Since(smp.start).Seconds())
		run.srv.kill()
		pts, mx := smp.stop()
		var smp2 *sampler
		offset := time.Since(smp.start).Seconds()
		rs := time.Now()
		run2, err := tg.Start(ctx, dir, func(pid int) { smp2 = startSampler(pid, 100*time.Millisecond, offset) })
		replay := time.Since(rs).Seconds()
		if err != nil {
			errs = append(errs, fmt.Errorf("restart: %w", err))
			res.RSSOverTime, res.MaxRSSBytes = pts, mx
			if smp2 != nil {
				p2, m2 := smp2.stop()
				res.RSSOverTime, res.MaxRSSBytes = append(res.RSSOverTime, p2...), max(mx, m2)
			}
			res.Error = errors.Join(errs...).Error()
			return res
		}
		run = run2
		res.setExtra("replay_seconds", replay)
		res.setExtra("ready_at_s", offset+replay)
		if m, err := readProcMem(run.srv.pid()); err == nil {
			res.setExtra("replay_peak_rss_bytes", float64(m.hwm))
			res.setExtra("replay_peak_over_steady", float64(m.hwm)/float64(max(res.RSSBytes, 1)))
		}
		select {
		case <-time.After(o.Settle):
		case <-ctx.Done():
		}
		if m, err := readProcMem(run.srv.pid()); err == nil {
			res.setExtra("rss_after_replay_bytes", float64(m.rss))
		}
		stored := storedSamples(ctx, run)
		blocksDir, took, err := run.Finish(ctx)
		res.StopSeconds = took.Seconds()
		p2, m2 := smp2.stop()
		res.RSSOverTime, res.MaxRSSBytes = append(pts, p2...), max(mx, m2)
		errs = append(errs, checkBlocks(res, blocksDir, err, stored)...)
		if err := errors.Join(errs...); err != nil {
			res.Error = err.Error()
		}
		return res
	}

	stored := storedSamples(ctx, run)
	blocksDir, took, err := run.Finish(ctx)
	res.StopSeconds = took.Seconds()
	res.RSSOverTime, res.MaxRSSBytes = smp.stop()
	errs = append(errs, checkBlocks(res, blocksDir, err, stored)...)
	if err := errors.Join(errs...); err != nil {
		res.Error = err.Error()
	}
	return res
}

// stored is what a server without blocks reports it holds (Running.StoredSamples).
type stored struct {
	n   int64
	err error
	ok  bool
}

func storedSamples(ctx context.Context, run *Running) stored {
	if run.StoredSamples == nil {
		return stored{}
	}
	n, err := run.StoredSamples(ctx)
	return stored{n: n, err: err, ok: true}
}

// checkBlocks measures the blocks and requires that they hold exactly the
// accepted samples: the proof that nothing acknowledged was lost. For a
// server without blocks, what it reports storing is compared instead.
func checkBlocks(res *TargetResult, blocksDir string, finishErr error, st stored) []error {
	if finishErr != nil {
		return []error{finishErr}
	}
	if blocksDir == "" && st.ok {
		if st.err != nil {
			return []error{fmt.Errorf("stored samples: %w", st.err)}
		}
		res.Blocks.NumSamples = st.n
		if res.Load != nil {
			res.setExtra("lost_samples", float64(res.Load.Accepted-st.n))
			if st.n != res.Load.Accepted {
				return []error{fmt.Errorf("server holds %d samples, %d were accepted", st.n, res.Load.Accepted)}
			}
		}
		return nil
	}
	b, err := measureBlocks(blocksDir)
	if err != nil {
		return []error{fmt.Errorf("measure blocks: %w", err)}
	}
	res.Blocks = b
	if res.Load != nil {
		res.setExtra("lost_samples", float64(res.Load.Accepted-b.NumSamples))
		if b.NumSamples != res.Load.Accepted {
			return []error{fmt.Errorf("blocks hold %d samples, %d were accepted", b.NumSamples, res.Load.Accepted)}
		}
	}
	return nil
}

// fetch GETs url into path.
// fetchMemStats saves the runtime.MemStats section of the text heap profile
// (the records before it are in the .pb.gz already).
func fetchMemStats(ctx context.Context, baseURL, path string) error {
	if err := fetch(ctx, baseURL+"/debug/pprof/heap?gc=1&debug=1", path); err != nil {
		return err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i := bytes.Index(b, []byte("# runtime.MemStats"))
	if i < 0 {
		return fmt.Errorf("%s: no runtime.MemStats section", path)
	}
	return os.WriteFile(path, b[i:], 0o644)
}

func fetch(ctx context.Context, url, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
