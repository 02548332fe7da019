// Package fleetstart is the catch-up scenario with real forwarders: N
// forward.Forwarders (in process, each with its own on-disk queue, policy,
// anonymization and remote-write 2.0 sender) hold the backlog of an outage
// and are started at the same instant against one receiver, as after a
// fleet-wide restart or rollout. It measures what the receiver sees: the
// requests in flight at once and the write latency (issue 20: jitter).
package fleetstart

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/bench"
	"github.com/phonehome/phonehome/bench/fleet"
	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/relabel"
)

// Options configures Run.
type Options struct {
	BaseURL          string // the receiver, e.g. http://127.0.0.1:9291
	TokenFile        string // bearer token for the receiver
	Dir              string // queues go in Dir/<cluster>
	Clusters         int
	SeriesPerCluster int
	Backlog          int           // collections queued during the outage, per forwarder
	Interval         time.Duration // the forwarders' --interval
	Jitter           float64       // forward.Options.Jitter (0: default, forward.NoJitter: off)
	Seed             uint64
}

// Result is what the receiver saw once the forwarders were started.
type Result struct {
	Jitter          float64       `json:"jitter"`
	Requests        int64         `json:"requests"`
	Failed          int64         `json:"failed_requests"` // non-2xx or transport errors
	PeakInFlight    int64         `json:"peak_in_flight"`
	P50, P99, Max   time.Duration `json:"-"`
	Drained         time.Duration `json:"-"` // start to the last request answered
	PrefillDuration time.Duration `json:"-"`
	// InFlightBy100ms is the peak of in-flight requests per 100 ms since start.
	InFlightBy100ms []int64 `json:"-"`
}

// Run fills every forwarder's queue with o.Backlog collections (timestamps
// o.Interval apart, ending now), starts all of them at once and waits until
// every queue is empty and every forwarder has made its first live
// collection (at most Jitter×Interval after start) and delivered it.
func Run(ctx context.Context, o Options) (*Result, error) {
	tmpl, err := fleet.LoadTemplateFiles(bench.FederateSample, bench.TelemetryAllowlist)
	if err != nil {
		return nil, err
	}
	fl, err := fleet.New(tmpl, o.Clusters, o.SeriesPerCluster, o.Seed)
	if err != nil {
		return nil, err
	}
	base, err := url.Parse(o.BaseURL)
	if err != nil {
		return nil, err
	}
	allow, err := allowlist.Parse([]string{`{__name__=~".+"}`})
	if err != nil {
		return nil, err
	}
	ct := &countingTransport{next: &http.Transport{MaxIdleConnsPerHost: o.Clusters, MaxIdleConns: o.Clusters}}
	client := &http.Client{Transport: ct}
	logger := slog.New(slog.DiscardHandler)

	type member struct {
		f   *forward.Forwarder
		q   *forward.Queue
		src *source
	}
	ms := make([]member, o.Clusters)
	defer func() {
		for _, m := range ms {
			if m.q != nil {
				_ = m.q.Close()
			}
		}
	}()
	prefill := time.Now()
	now := time.Now()
	for c := range ms {
		rules, err := relabel.Parse(relabel.Config{ID: fmt.Sprintf("cluster-%d", c), Salt: []byte("fleetstart-salt-0123456789")})
		if err != nil {
			return nil, err
		}
		q, err := forward.OpenQueue(filepath.Join(o.Dir, fmt.Sprint(c)), logger, nil, forward.QueueOptions{MaxBytes: 64 << 20})
		if err != nil {
			return nil, err
		}
		src := &source{fl: fl, c: c, step: o.Interval, t0: now.Add(-time.Duration(o.Backlog) * o.Interval)}
		sender := forward.NewHTTPSender(base, client, forward.HTTPSenderOptions{TokenFile: o.TokenFile, Version: forward.VersionV2})
		f := forward.New(logger, nil, src, forward.Policy{Allow: allow, Rules: rules}, q, sender, forward.Options{
			Interval: o.Interval, Jitter: o.Jitter, SeriesCacheSize: -1,
		})
		ms[c] = member{f: f, q: q, src: src}
		for range o.Backlog { // the outage: collected, not delivered
			if err := f.Collect(ctx); err != nil {
				return nil, fmt.Errorf("prefill cluster %d: %w", c, err)
			}
		}
		src.live.Store(true)
	}
	res := &Result{Jitter: o.Jitter, PrefillDuration: time.Since(prefill)}

	// Everyone starts now.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	ct.begin(start)
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() { _ = m.f.Run(runCtx) })
	}
	// Every first live collection happens within Jitter×Interval.
	firstBy := start.Add(time.Duration(max(o.Jitter, 0) * float64(o.Interval)))
	if o.Jitter == 0 {
		firstBy = start.Add(time.Duration(forward.DefaultJitter * float64(o.Interval)))
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			cancel()
			wg.Wait()
			return nil, ctx.Err()
		case <-tick.C:
		}
		if time.Now().Before(firstBy) {
			continue
		}
		done := true
		for _, m := range ms {
			if n, _ := m.q.Len(); n > 0 || m.src.fetches.Load() <= int64(o.Backlog) {
				done = false
				break
			}
		}
		if done {
			break
		}
	}
	res.Drained = ct.lastDone()
	cancel()
	wg.Wait()
	ct.summarize(res)
	return res, nil
}

// source serves cluster c's series: o.Backlog rounds o.Interval apart for the
// prefill, then the current time.
type source struct {
	fl      *fleet.Fleet
	c       int
	step    time.Duration
	t0      time.Time
	live    atomic.Bool
	fetches atomic.Int64
	batch   fleet.Batch
}

func (s *source) Fetch(_ context.Context, fn func(*forward.Sample) error) (forward.FetchStats, error) {
	r := int(s.fetches.Add(1) - 1)
	t0, step := s.t0, s.step
	if s.live.Load() {
		r, t0, step = 0, time.Now(), 0
	}
	s.fl.Fill(&s.batch, s.c, 0, s.fl.SeriesPerCluster(), r, t0.UnixMilli(), step.Milliseconds())
	b := labels.NewScratchBuilder(16)
	var smp forward.Sample
	for _, ts := range s.batch.Series {
		b.Reset()
		for _, l := range ts.Labels {
			if l.Name != fleet.ClusterLabel { // the forwarder sets _id
				b.Add(l.Name, l.Value)
			}
		}
		b.Sort()
		smp = forward.Sample{Labels: b.Labels(), T: ts.Samples[0].Timestamp, V: ts.Samples[0].Value}
		if err := fn(&smp); err != nil {
			return forward.FetchStats{}, err
		}
	}
	return forward.FetchStats{}, nil
}

// countingTransport counts the write requests in flight to the receiver
// (on loopback, what the receiver has in flight) and their latencies.
type countingTransport struct {
	next     http.RoundTripper
	inflight atomic.Int64
	peak     atomic.Int64
	failed   atomic.Int64
	t0       time.Time

	mu        sync.Mutex
	latencies []time.Duration
	buckets   []int64 // peak in flight per 100ms
	last      time.Duration
}

func (t *countingTransport) begin(t0 time.Time) {
	t.mu.Lock()
	t.t0, t.latencies, t.buckets, t.last = t0, nil, nil, 0
	t.mu.Unlock()
	t.peak.Store(0)
	t.failed.Store(0)
}

func (t *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	n := t.inflight.Add(1)
	start := time.Now()
	t.mu.Lock()
	if !t.t0.IsZero() {
		b := int(start.Sub(t.t0) / (100 * time.Millisecond))
		for len(t.buckets) <= b {
			t.buckets = append(t.buckets, 0)
		}
		t.buckets[b] = max(t.buckets[b], n)
	}
	t.mu.Unlock()
	for p := t.peak.Load(); n > p && !t.peak.CompareAndSwap(p, n); p = t.peak.Load() {
	}
	resp, err := t.next.RoundTrip(r)
	if err == nil {
		// Count until the body is read: the sender reads it before the
		// next request, so the response headers mark the end closely.
		if resp.StatusCode/100 != 2 {
			t.failed.Add(1)
		}
	} else {
		t.failed.Add(1)
	}
	took := time.Since(start)
	t.inflight.Add(-1)
	t.mu.Lock()
	if !t.t0.IsZero() {
		t.latencies = append(t.latencies, took)
		t.last = max(t.last, time.Since(t.t0))
	}
	t.mu.Unlock()
	return resp, err
}

func (t *countingTransport) lastDone() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last
}

func (t *countingTransport) summarize(res *Result) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := slices.Clone(t.latencies)
	slices.Sort(l)
	res.Requests = int64(len(l))
	res.Failed = t.failed.Load()
	res.PeakInFlight = t.peak.Load()
	res.InFlightBy100ms = slices.Clone(t.buckets)
	if len(l) > 0 {
		q := func(p float64) time.Duration { return l[min(len(l)-1, int(p*float64(len(l))))] }
		res.P50, res.P99, res.Max = q(0.5), q(0.99), l[len(l)-1]
	}
}

// WriteTokenFile writes token to dir/token and returns its path.
func WriteTokenFile(dir, token string) (string, error) {
	p := filepath.Join(dir, "token")
	return p, os.WriteFile(p, []byte(token+"\n"), 0o600)
}
