package fleet

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// Options configures Run. Zero values take the defaults noted.
type Options struct {
	URL   string // remote-write endpoint, e.g. http://127.0.0.1:9291/api/v1/write
	Token string // sent as "Authorization: Bearer <Token>" when not empty

	Rounds int // rounds to send; every round sends one point per series (default 5)
	// Interval is the wall time between round starts. 0 sends the next round
	// as soon as the previous one is done (saturation). A round that takes
	// longer than Interval delays the next; the lag is reported.
	Interval time.Duration
	// Step is the simulated time between rounds, i.e. the spacing of sample
	// timestamps (default 4m30s, the forwarder's default interval).
	Step time.Duration
	// Start is the timestamp of round 0. Zero means now - (Rounds-1)*Step, so
	// that the last round is stamped about now and nothing is in the future.
	Start time.Time

	Concurrency    int           // parallel requests (default 8)
	BatchSeries    int           // max series per request; a request never spans clusters (default 500)
	RequestTimeout time.Duration // per request (default 60s)
	MaxLatencies   int           // latency reservoir size (default 1<<20)

	// PreEncode builds every request body before the first round, so that
	// encoding does not compete with the server for CPU while it is measured.
	// It fails if the bodies would exceed MaxPreEncodedBytes (default 4 GiB).
	PreEncode          bool
	MaxPreEncodedBytes int64
	// Bodies, if set, are the bodies from EncodeAll(f, o) with the same
	// options; Run sends them (without consuming them) instead of encoding.
	// This sends byte-identical load to several targets.
	Bodies [][][]byte

	// Protocol is the remote-write version of the bodies: "1.0" (the
	// default, prometheus.WriteRequest) or "2.0" (io.prometheus.write.v2.Request,
	// one symbol table per request, as a 2.0 forwarder sends).
	Protocol string

	Client  *http.Client      // default: a client with Concurrency idle conns
	OnRound func(RoundResult) // called after every round, e.g. for progress output
}

func (o *Options) defaults() {
	if o.Rounds <= 0 {
		o.Rounds = 5
	}
	if o.Step <= 0 {
		o.Step = 270 * time.Second
	}
	if o.Start.IsZero() {
		o.Start = time.Now().Add(-time.Duration(o.Rounds-1) * o.Step)
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.BatchSeries <= 0 {
		o.BatchSeries = 500
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 60 * time.Second
	}
	if o.MaxPreEncodedBytes <= 0 {
		o.MaxPreEncodedBytes = 4 << 30
	}
	if o.MaxLatencies <= 0 {
		o.MaxLatencies = 1 << 20
	}
	if o.Protocol == "" {
		o.Protocol = ProtocolV1
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConns:        o.Concurrency,
			MaxIdleConnsPerHost: o.Concurrency,
			DisableCompression:  true,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
}

// RoundResult describes one round.
type RoundResult struct {
	Round    int           `json:"round"`
	Lag      time.Duration `json:"lag_ns"` // how late the round started against its schedule
	Duration time.Duration `json:"duration_ns"`
	Requests int64         `json:"requests"`
	Samples  int64         `json:"samples"`
	Accepted int64         `json:"accepted_samples"`
}

// Latency summarises request latencies in seconds.
type Latency struct {
	Count int     `json:"count"` // latencies kept (a uniform reservoir if there were more)
	Mean  float64 `json:"mean_s"`
	P50   float64 `json:"p50_s"`
	P90   float64 `json:"p90_s"`
	P99   float64 `json:"p99_s"`
	Max   float64 `json:"max_s"`
}

// Result is what Run measured.
type Result struct {
	URL           string    `json:"url"`
	Clusters      int       `json:"clusters"`
	SeriesPerClus int       `json:"series_per_cluster"`
	ActiveSeries  int       `json:"active_series"`
	Rounds        int       `json:"rounds"`
	RoundsDone    int       `json:"rounds_done"`
	Concurrency   int       `json:"concurrency"`
	BatchSeries   int       `json:"batch_series"`
	Interval      string    `json:"interval"`
	Step          string    `json:"step"`
	Start         time.Time `json:"start"`
	End           time.Time `json:"end"`
	Aborted       string    `json:"aborted,omitempty"` // why the run stopped early

	Requests       int64             `json:"requests"`
	Samples        int64             `json:"samples_sent"`
	Accepted       int64             `json:"accepted_samples"`
	BytesSent      int64             `json:"bytes_sent"`    // snappy-compressed bodies
	BytesEncoded   int64             `json:"bytes_encoded"` // protobuf before compression
	Codes          map[string]int64  `json:"codes"`         // HTTP status code (or "error") → requests
	ErrorExamples  map[string]string `json:"error_examples,omitempty"`
	BusySeconds    float64           `json:"busy_seconds"` // sum of round durations
	AcceptedPerSec float64           `json:"accepted_samples_per_second"`
	// Round 0 creates every series; later rounds only append. They are
	// reported separately because their costs differ by an order of magnitude.
	CreateAcceptedPerSec float64       `json:"create_accepted_samples_per_second"`
	SteadyAcceptedPerSec float64       `json:"steady_accepted_samples_per_second"`
	Latency              Latency       `json:"latency"`
	CreateLatency        Latency       `json:"create_latency"`
	SteadyLatency        Latency       `json:"steady_latency"`
	PerRound             []RoundResult `json:"per_round"`
	// Events are every answered request, for timelines; not serialised.
	Events []Event `json:"-"`
}

// Event is one request: when it was sent (since Result.Start), how long it
// took, and how many samples it carried that were accepted.
type Event struct {
	Start    time.Duration
	Latency  time.Duration
	Accepted int32
}

type job struct {
	c, from, to, r int
	body           []byte // pre-encoded, or nil
}

type workerStats struct {
	codes    map[string]int64
	examples map[string]string
	lat      [2]reservoir // [0] round 0, [1] later rounds
	sent     int64
	encoded  int64
	events   []Event
	t0       time.Time
}

// Run sends o.Rounds rounds of f's series to o.URL. It stops early, with the
// partial result and Aborted set, when ctx is done. Non-2xx responses are
// counted, not retried.
func Run(ctx context.Context, f *Fleet, o Options) (*Result, error) {
	o.defaults()
	if o.URL == "" {
		return nil, errors.New("no URL")
	}
	res := &Result{
		URL: o.URL, Clusters: f.Clusters(), SeriesPerClus: f.SeriesPerCluster(), ActiveSeries: f.ActiveSeries(),
		Rounds: o.Rounds, Concurrency: o.Concurrency, BatchSeries: o.BatchSeries,
		Interval: o.Interval.String(), Step: o.Step.String(), Codes: map[string]int64{},
	}
	var (
		jobs     = make(chan job)
		roundWG  sync.WaitGroup
		workerWG sync.WaitGroup
		reqs     atomic.Int64
		samples  atomic.Int64
		accepted atomic.Int64
		stats    = make([]*workerStats, o.Concurrency)
	)
	perWorker := max(1, o.MaxLatencies/o.Concurrency/2)
	for w := range stats {
		st := &workerStats{codes: map[string]int64{}, examples: map[string]string{}}
		st.lat[0] = newReservoir(perWorker, uint64(w))
		st.lat[1] = newReservoir(perWorker, uint64(w)+1000)
		stats[w] = st
		workerWG.Add(1)
		go func() {
			defer workerWG.Done()
			s := sender{f: f, o: &o, st: st}
			for j := range jobs {
				n, ok := s.send(ctx, j)
				reqs.Add(1)
				samples.Add(int64(n))
				if ok {
					accepted.Add(int64(n))
				}
				roundWG.Done()
			}
		}()
	}

	pre, keep := o.Bodies, o.Bodies != nil
	if pre == nil && o.PreEncode {
		var err error
		if pre, err = EncodeAll(ctx, f, o); err != nil {
			close(jobs)
			workerWG.Wait()
			return nil, err
		}
	}

	res.Start = time.Now()
	for _, st := range stats {
		st.t0 = res.Start
	}
	begin := res.Start
rounds:
	for r := range o.Rounds {
		sched := begin.Add(time.Duration(r) * o.Interval)
		if d := time.Until(sched); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				res.Aborted = ctx.Err().Error()
				break rounds
			case <-t.C:
			}
		}
		rs := time.Now()
		if o.Interval == 0 {
			sched = rs // unpaced: a round is never late
		}
		r0, s0, a0 := reqs.Load(), samples.Load(), accepted.Load()
		k := 0
	send:
		for c := range f.Clusters() {
			for from := 0; from < f.SeriesPerCluster(); from += o.BatchSeries {
				j := job{c: c, from: from, to: min(from+o.BatchSeries, f.SeriesPerCluster()), r: r}
				if pre != nil {
					j.body = pre[r][k]
					if !keep {
						pre[r][k] = nil // let the GC have it once sent
					}
					k++
				}
				roundWG.Add(1)
				select {
				case jobs <- j:
				case <-ctx.Done():
					roundWG.Done()
					break send
				}
			}
		}
		roundWG.Wait()
		rr := RoundResult{
			Round: r, Lag: rs.Sub(sched), Duration: time.Since(rs),
			Requests: reqs.Load() - r0, Samples: samples.Load() - s0, Accepted: accepted.Load() - a0,
		}
		res.PerRound = append(res.PerRound, rr)
		if o.OnRound != nil {
			o.OnRound(rr)
		}
		if ctx.Err() != nil {
			res.Aborted = ctx.Err().Error()
			break
		}
		res.RoundsDone++
	}
	close(jobs)
	workerWG.Wait()
	res.End = time.Now()

	res.Requests, res.Samples, res.Accepted = reqs.Load(), samples.Load(), accepted.Load()
	var all, create, steady []float64
	for _, st := range stats {
		for k, v := range st.codes {
			res.Codes[k] += v
		}
		for k, v := range st.examples {
			if res.ErrorExamples == nil {
				res.ErrorExamples = map[string]string{}
			}
			res.ErrorExamples[k] = v
		}
		res.Events = append(res.Events, st.events...)
		res.BytesSent += st.sent
		res.BytesEncoded += st.encoded
		create = append(create, st.lat[0].vals...)
		steady = append(steady, st.lat[1].vals...)
	}
	all = append(append(all, create...), steady...)
	res.Latency, res.CreateLatency, res.SteadyLatency = summarize(all), summarize(create), summarize(steady)

	var busy, steadyBusy float64
	var steadyAcc int64
	for _, rr := range res.PerRound {
		busy += rr.Duration.Seconds()
		if rr.Round == 0 {
			res.CreateAcceptedPerSec = perSec(rr.Accepted, rr.Duration.Seconds())
			continue
		}
		steadyBusy += rr.Duration.Seconds()
		steadyAcc += rr.Accepted
	}
	res.BusySeconds = busy
	res.AcceptedPerSec = perSec(res.Accepted, busy)
	res.SteadyAcceptedPerSec = perSec(steadyAcc, steadyBusy)
	return res, nil
}

// EncodeAll builds the bodies of every round's requests, in send order, on
// all CPUs, for Options.Bodies. o must have Start set for the bodies to be
// reusable across runs.
func EncodeAll(ctx context.Context, f *Fleet, o Options) ([][][]byte, error) {
	o.defaults()
	perCluster := (f.SeriesPerCluster() + o.BatchSeries - 1) / o.BatchSeries
	pre := make([][][]byte, o.Rounds)
	for r := range pre {
		pre[r] = make([][]byte, f.Clusters()*perCluster)
	}
	var (
		total atomic.Int64
		next  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	n := int64(o.Rounds * f.Clusters())
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			s := sender{f: f, o: &o}
			for {
				i := next.Add(1) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				r, c := int(i)/f.Clusters(), int(i)%f.Clusters()
				for b := range perCluster {
					from := b * o.BatchSeries
					body, err := s.encode(job{c: c, from: from, to: min(from+o.BatchSeries, f.SeriesPerCluster()), r: r})
					if err == nil && total.Add(int64(len(body))) > o.MaxPreEncodedBytes {
						err = fmt.Errorf("pre-encoded bodies exceed %d bytes; send fewer rounds or disable pre-encoding", o.MaxPreEncodedBytes)
					}
					if err != nil {
						errMu.Lock()
						first = cmp.Or(first, err)
						errMu.Unlock()
						next.Store(n)
						return
					}
					pre[r][c*perCluster+b] = bytes.Clone(body)
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return pre, first
}

func perSec(n int64, s float64) float64 {
	if s <= 0 {
		return 0
	}
	return float64(n) / s
}

// sender encodes and sends one request at a time, reusing its buffers.
type sender struct {
	f     *Fleet
	o     *Options
	st    *workerStats
	batch Batch
	raw   []byte
	enc   []byte
}

// Remote-write versions for Options.Protocol.
const (
	ProtocolV1 = "1.0"
	ProtocolV2 = "2.0"
)

// Encode builds the snappy-compressed remote-write body of job j, in
// o.Protocol, into the sender's buffers.
func (s *sender) encode(j job) ([]byte, error) {
	s.f.Fill(&s.batch, j.c, j.from, j.to, j.r, s.o.Start.UnixMilli(), s.o.Step.Milliseconds())
	var err error
	if s.o.Protocol == ProtocolV2 {
		err = s.marshalV2()
	} else {
		req := prompb.WriteRequest{Timeseries: s.batch.Series}
		n := req.Size()
		if cap(s.raw) < n {
			s.raw = make([]byte, n)
		}
		s.raw = s.raw[:n]
		_, err = req.MarshalToSizedBuffer(s.raw)
	}
	if err != nil {
		return nil, fmt.Errorf("marshal write request: %w", err)
	}
	s.enc = snappy.Encode(s.enc[:cap(s.enc)], s.raw)
	return s.enc, nil
}

// marshalV2 symbolizes the batch as a remote-write 2.0 request into s.raw.
func (s *sender) marshalV2() error {
	st := writev2.NewSymbolTable()
	req := writev2.Request{Timeseries: make([]writev2.TimeSeries, len(s.batch.Series))}
	for i, ts := range s.batch.Series {
		refs := make([]uint32, 0, 2*len(ts.Labels))
		for _, l := range ts.Labels {
			refs = append(refs, st.Symbolize(l.Name), st.Symbolize(l.Value))
		}
		smp := make([]writev2.Sample, len(ts.Samples))
		for k, x := range ts.Samples {
			smp[k] = writev2.Sample{Value: x.Value, Timestamp: x.Timestamp}
		}
		req.Timeseries[i] = writev2.TimeSeries{LabelsRefs: refs, Samples: smp}
	}
	req.Symbols = st.Symbols()
	n := req.Size()
	if cap(s.raw) < n {
		s.raw = make([]byte, n)
	}
	s.raw = s.raw[:n]
	_, err := req.MarshalToSizedBuffer(s.raw)
	return err
}

// send sends job j and reports how many samples it carried and whether they
// were accepted (2xx).
func (s *sender) send(ctx context.Context, j job) (int, bool) {
	n := j.to - j.from
	body := j.body
	if body == nil {
		var err error
		if body, err = s.encode(j); err != nil {
			s.fail("encode", err.Error())
			return n, false
		}
		s.st.encoded += int64(len(s.raw))
	}
	s.st.sent += int64(len(body))
	rctx, cancel := context.WithTimeout(ctx, s.o.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, s.o.URL, bytes.NewReader(body))
	if err != nil {
		s.fail("error", err.Error())
		return n, false
	}
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("User-Agent", "phonehome-fleetgen")
	if s.o.Protocol == ProtocolV2 {
		req.Header.Set("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request")
		req.Header.Set("X-Prometheus-Remote-Write-Version", "2.0.0")
	} else {
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	}
	if s.o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.o.Token)
	}
	start := time.Now()
	resp, err := s.o.Client.Do(req)
	if err != nil {
		s.fail("error", err.Error())
		return n, false
	}
	var msg []byte
	if resp.StatusCode/100 != 2 {
		msg, _ = io.ReadAll(io.LimitReader(resp.Body, 512))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	took := time.Since(start)
	lat := took.Seconds()
	ev := Event{Start: start.Sub(s.st.t0), Latency: took}
	if resp.StatusCode/100 == 2 {
		ev.Accepted = int32(n)
	}
	s.st.events = append(s.st.events, ev)
	if j.r == 0 {
		s.st.lat[0].add(lat)
	} else {
		s.st.lat[1].add(lat)
	}
	code := strconv.Itoa(resp.StatusCode)
	if resp.StatusCode/100 != 2 {
		s.fail(code, string(msg))
		return n, false
	}
	s.st.codes[code]++
	return n, true
}

func (s *sender) fail(code, msg string) {
	s.st.codes[code]++
	if _, ok := s.st.examples[code]; !ok {
		s.st.examples[code] = msg
	}
}

// reservoir keeps a uniform sample of at most size values (Algorithm R).
type reservoir struct {
	vals []float64
	size int
	seen int
	rng  *rand.Rand
}

func newReservoir(size int, seed uint64) reservoir {
	return reservoir{vals: make([]float64, 0, min(size, 4096)), size: size, rng: rand.New(rand.NewPCG(seed, 0x5eed))}
}

func (r *reservoir) add(v float64) {
	r.seen++
	if len(r.vals) < r.size {
		r.vals = append(r.vals, v)
		return
	}
	if i := r.rng.IntN(r.seen); i < r.size {
		r.vals[i] = v
	}
}

func summarize(v []float64) Latency {
	if len(v) == 0 {
		return Latency{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	q := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return Latency{Count: len(s), Mean: sum / float64(len(s)), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: s[len(s)-1]}
}
