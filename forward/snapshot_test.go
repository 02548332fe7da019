package forward

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/forward/telemetertest"
)

// cycleRecord is a queue payload of one cycle whose samples all hold value v.
func cycleRecord(t *testing.T, v float64) []byte {
	t.Helper()
	req := telemeterBatch(time.Now().UnixMilli())
	for i := range req.Timeseries {
		for j := range req.Timeseries[i].Samples {
			req.Timeseries[i].Samples[j].Value = v
		}
	}
	body, err := EncodeWriteRequest(req)
	require.NoError(t, err)
	return encodePayload(countSamples(req), body)
}

// steppingClock is a queue clock that the test moves by whole intervals.
type steppingClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *steppingClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *steppingClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// snapshotForwarder is a forwarder with an empty queue on clock that
// uploads to a stock telemeter-server stand-in, its credential obtained (as
// Authorizer.Run does at start).
func snapshotForwarder(t *testing.T, srv *telemetertest.Server, clock *steppingClock, opts Options) *Forwarder {
	t.Helper()
	reg := prometheus.NewRegistry()
	q, err := OpenQueue(t.TempDir(), discardLogger(), reg, QueueOptions{Now: clock.now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	a, s := newTelemeterPair(t, srv, reg)
	_, err = a.Token(context.Background())
	require.NoError(t, err)
	require.True(t, s.StoresAtArrival())
	opts.Interval = time.Minute
	return New(discardLogger(), reg, nil, Policy{}, q, s, opts)
}

// uploadedValues are the distinct sample values a telemeter stand-in took.
func uploadedValues(srv *telemetertest.Server) map[float64]int {
	out := map[float64]int{}
	for _, mf := range srv.Families() {
		for _, m := range mf.GetMetric() {
			out[m.GetUntyped().GetValue()]++
		}
	}
	return out
}

// sendQueued runs f's send loop until its queue is empty.
func sendQueued(f *Forwarder) {
	draining := make(chan struct{})
	close(draining)
	f.sendLoop(context.Background(), draining)
}

// A stock telemeter-server stores every upload at the time it arrives:
// after an outage, a backlog replayed in order would be stored as current
// one stale cycle after another, at one upload per window, and never
// shrink. The forwarder delivers the latest cycle and drops the older ones,
// as telemeter-client, which uploads only its latest snapshot.
func TestStockTelemeterServerGetsTheLatestCycleOfABacklog(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	clock := &steppingClock{t: time.Now()}
	f := snapshotForwarder(t, srv, clock, Options{})
	for _, v := range []float64{1, 2, 3} { // three cycles queued during an outage
		require.NoError(t, f.q.Append(cycleRecord(t, v)))
		clock.add(time.Minute)
	}

	sendQueued(f)
	require.Equal(t, 1, srv.Uploads(), "one upload: the latest cycle")
	require.Equal(t, map[float64]int{3: 4}, uploadedValues(srv))
	require.Equal(t, 4.0, testutil.ToFloat64(f.m.sent))
	require.Equal(t, 8.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonSuperseded)))
	n, _ := f.q.Len()
	require.Zero(t, n)
}

// A cycle that fails and is retried is dropped when a later cycle has been
// queued meanwhile: the retry sends the later one.
func TestStockTelemeterServerRetryTakesTheLaterCycle(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	srv.FailNext(http.StatusServiceUnavailable)
	clock := &steppingClock{t: time.Now()}
	var f *Forwarder
	f = snapshotForwarder(t, srv, clock, Options{sleep: func(ctx context.Context, _ time.Duration) error {
		clock.add(time.Minute) // the next cycle is collected during the backoff
		return f.q.Append(cycleRecord(t, 2))
	}})
	require.NoError(t, f.q.Append(cycleRecord(t, 1)))

	sendQueued(f)
	require.Equal(t, 2, srv.Uploads(), "the refused upload, then the later cycle")
	require.Equal(t, map[float64]int{2: 4}, uploadedValues(srv))
	require.Equal(t, 4.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonSuperseded)))
	require.Equal(t, 4.0, testutil.ToFloat64(f.m.sent))
}

// The server takes one upload per window: a cycle waiting for it is
// superseded by one queued meanwhile, so the upload at the window's end
// carries the latest cycle, and the wait is not part of the send's duration.
func TestStockTelemeterServerWindowWaitTakesTheLaterCycle(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	clock := &steppingClock{t: time.Now()}
	f := snapshotForwarder(t, srv, clock, Options{})
	s := f.sender.(*TelemeterSender)
	s.pacer.limited, s.pacer.last = true, time.Now() // the server has shown its limiter
	waits := 0
	s.pacer.sleep = func(context.Context, time.Duration) error {
		waits++
		clock.add(time.Minute) // the next cycle is collected while the upload waits
		return f.q.Append(cycleRecord(t, 2))
	}
	require.NoError(t, f.q.Append(cycleRecord(t, 1)))

	p, pos, queuedAt, ok, err := f.q.Peek()
	require.NoError(t, err)
	require.True(t, ok)
	f.deliver(context.Background(), p, pos, queuedAt)
	require.Equal(t, 1, waits)
	require.Zero(t, srv.Uploads(), "the waiting cycle is superseded, not uploaded")
	require.Equal(t, 4.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonSuperseded)))

	s.pacer.last = time.Time{} // the window has passed
	sendQueued(f)
	require.Equal(t, map[float64]int{2: 4}, uploadedValues(srv))
}

// A cycle left in the queue from before a restart (or from before the
// collections failed) is not sent alone as current: it is over an interval
// old, and the next cycle replaces it.
func TestStockTelemeterServerGetsNoOldCycleAlone(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	clock := &steppingClock{t: time.Now().Add(-2 * time.Minute)}
	f := snapshotForwarder(t, srv, clock, Options{})
	require.NoError(t, f.q.Append(cycleRecord(t, 1)))
	clock.add(2 * time.Minute) // now: the record is two intervals old

	sendQueued(f)
	require.Zero(t, srv.Uploads())
	require.Equal(t, 4.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonSuperseded)))

	require.NoError(t, f.q.Append(cycleRecord(t, 2))) // this run's first cycle
	sendQueued(f)
	require.Equal(t, map[float64]int{2: 4}, uploadedValues(srv))
}

// Records queued within one cycle (a cycle split before the server was
// known) are all delivered: none supersedes another.
func TestStockTelemeterServerKeepsTheRecordsOfOneCycle(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	clock := &steppingClock{t: time.Now()}
	f := snapshotForwarder(t, srv, clock, Options{})
	require.NoError(t, f.q.Append(cycleRecord(t, 1), cycleRecord(t, 2)))
	clock.add(time.Minute / 4)
	require.NoError(t, f.q.Append(cycleRecord(t, 3)))

	sendQueued(f)
	require.Equal(t, map[float64]int{1: 4, 2: 4, 3: 4}, uploadedValues(srv))
	require.Zero(t, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonSuperseded)))
}

// stampingSender is a Sender for a server that stores uploads at their
// arrival; it records the requests.
type stampingSender struct{ reqs []*prompb.WriteRequest }

func (s *stampingSender) Send(_ context.Context, req *prompb.WriteRequest) error {
	s.reqs = append(s.reqs, req)
	return nil
}

func (*stampingSender) StoresAtArrival() bool { return true }

func (*stampingSender) LearnServer(context.Context) {}

func (*stampingSender) WaitForWindow(context.Context) error { return nil }

// For such a server a cycle is queued as one record, so it goes as one
// upload (as telemeter-client's does), whatever max_samples_per_request
// says: the server takes one upload per window.
func TestStockTelemeterServerCycleIsOneUpload(t *testing.T) {
	s := &stampingSender{}
	f, q := fixtureForwarder(t, s, Options{})

	require.NoError(t, f.Collect(context.Background()))
	n, _ := q.Len()
	require.Equal(t, 1, n, "224 samples in one record, not five of at most 50")
	sendQueued(f)
	require.Len(t, s.reqs, 1)
	require.Equal(t, 224, countSamples(s.reqs[0]))
}

// Only an answer from a stock telemeter-server makes deliveries snapshots:
// our receiver keeps the samples' timestamps on both paths, and nothing is
// known before the first answer.
func TestStoresAtArrivalFollowsTheAuthorizeAnswer(t *testing.T) {
	stock := func(w http.ResponseWriter) {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"version": 1, "token": "c", "expiresInSeconds": 3600, "labels": map[string]string{"_id": telemeterHashedID},
		})
	}
	ours := func(w http.ResponseWriter) {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"token": "c", "expires_in_seconds": 3600, "tenant": "t", "cluster_id": telemeterHashedID,
			"version": 1, "expiresInSeconds": 3600, "labels": map[string]string{"_id": telemeterHashedID},
		})
	}
	notFound := func(w http.ResponseWriter) { http.Error(w, "404 page not found", http.StatusNotFound) }
	for _, tc := range []struct {
		name     string
		answer   func(w http.ResponseWriter)
		protocol string
		want     bool
	}{
		{"stock server, auto", stock, ProtocolAuto, true},
		{"stock server, telemeter", stock, ProtocolTelemeter, true},
		{"stock server, remote-write", stock, ProtocolRemoteWrite, false},
		{"our receiver, auto", ours, ProtocolAuto, false},
		{"our receiver, telemeter", ours, ProtocolTelemeter, false},
		{"no /authorize", notFound, ProtocolAuto, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, srv := newFleetEndpoint(t, tc.answer)
			base, _ := url.Parse(srv.URL)
			a := NewAuthorizer(slog.New(slog.DiscardHandler), nil, base, srv.Client(), AuthorizerOptions{Token: "fleet", ClusterID: telemeterHashedID})
			ps := NewProtocolSender(ProtocolSenderOptions{
				Protocol: tc.protocol, Authorizer: a,
				RemoteWrite: NewHTTPSender(base, srv.Client(), HTTPSenderOptions{Credentials: a}),
				Telemeter:   NewTelemeterSender(srv.URL+"/upload", srv.Client(), a, TelemeterSenderOptions{}),
			})
			require.False(t, ps.StoresAtArrival(), "unknown before the first answer")
			_, err := a.Token(context.Background())
			require.NoError(t, err)
			require.Equal(t, tc.want, ps.StoresAtArrival())
		})
	}
}

// At a start, the queue restored from disk is delivered before the
// authorizer may have answered: the server, unknown until then, is learnt
// before the record to send is chosen, so a stock telemeter-server gets
// the latest cycle, not the oldest as current.
func TestStockTelemeterServerGetsTheLatestCycleBeforeTheFirstAnswer(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	clock := &steppingClock{t: time.Now()}
	reg := prometheus.NewRegistry()
	q, err := OpenQueue(t.TempDir(), discardLogger(), reg, QueueOptions{Now: clock.now})
	require.NoError(t, err)
	defer q.Close()
	for _, v := range []float64{1, 2} { // cycles a previous run left queued
		require.NoError(t, q.Append(cycleRecord(t, v)))
		clock.add(time.Minute)
	}
	_, s := newTelemeterPair(t, srv, reg)
	require.False(t, s.StoresAtArrival(), "no answer yet")
	f := New(discardLogger(), reg, nil, Policy{}, q, s, Options{Interval: time.Minute})

	sendQueued(f)
	require.Equal(t, map[float64]int{2: 4}, uploadedValues(srv))
	require.Equal(t, 4.0, testutil.ToFloat64(f.m.dropped.WithLabelValues(ReasonSuperseded)))
}

// fixtureForwarder collects the federate fixture with
// max_samples_per_request 50 (224 samples: five requests when split) and
// delivers to sender.
func fixtureForwarder(t *testing.T, sender Sender, opts Options) (*Forwarder, *Queue) {
	t.Helper()
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), true)
	pol := fixturePolicy(t)
	q, err := OpenQueue(t.TempDir(), discardLogger(), nil, QueueOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	src := NewFederator(mustURL(t, prom.URL), http.DefaultClient, FederateOptions{Matches: pol.Allow.Selectors()})
	opts.MaxSamplesPerRequest = 50
	return New(discardLogger(), nil, src, pol, q, sender, opts), q
}

// The first cycle after a start is collected while the authorizer's first
// answer may still be on its way: the collection asks first, so a stock
// telemeter-server gets that cycle as one upload too, not in parts over
// several windows with the later ones superseded.
func TestStockTelemeterServerFirstCycleIsOneUpload(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	_, s := newTelemeterPair(t, srv, nil)
	require.False(t, s.StoresAtArrival(), "no answer yet")
	f, q := fixtureForwarder(t, s, Options{})

	require.NoError(t, f.Collect(context.Background()))
	n, _ := q.Len()
	require.Equal(t, 1, n, "the server was learnt before the cycle was queued")
}

// A fleet endpoint that does not answer /authorize within the bound does
// not hold the collection up: the cycle is queued split, as remote-write
// wants it.
func TestCollectDoesNotWaitForAnAuthorizerThatHangs(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	_, s := telemeterPairAt(t, func(http.ResponseWriter, *http.Request) { <-release }, 0)
	f, q := fixtureForwarder(t, s, Options{learnServerTimeout: 50 * time.Millisecond})

	require.NoError(t, f.Collect(context.Background()))
	n, _ := q.Len()
	require.Equal(t, 5, n, "224 samples in requests of at most 50")
}

// Nor does one whose answer the authorizer's Run is waiting for: the
// collection waits for Run's exchange no longer than the bound either.
func TestCollectDoesNotWaitForRunsHangingExchange(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer close(release)
	a, s := telemeterPairAt(t, func(http.ResponseWriter, *http.Request) {
		once.Do(func() { close(entered) })
		<-release
	}, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	<-entered
	f, q := fixtureForwarder(t, s, Options{learnServerTimeout: 50 * time.Millisecond})

	start := time.Now()
	require.NoError(t, f.Collect(context.Background()))
	require.Less(t, time.Since(start), 10*time.Second, "not Run's exchange timeout (1m)")
	n, _ := q.Len()
	require.Equal(t, 5, n, "224 samples in requests of at most 50")
}

// telemeterPairAt is an Authorizer (always, exchange timeout as given; 0:
// the default) and a TelemeterSender towards a fleet endpoint served by h.
func telemeterPairAt(t *testing.T, h http.HandlerFunc, timeout time.Duration) (*Authorizer, *TelemeterSender) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	base := mustURL(t, srv.URL)
	authURL, err := TelemeterAuthorizeURL(base, "", telemeterHashedID)
	require.NoError(t, err)
	a := NewAuthorizer(discardLogger(), nil, base, srv.Client(), AuthorizerOptions{
		Mode: AuthorizeAlways, Token: "fleet", ClusterID: telemeterHashedID, URL: authURL, Timeout: timeout,
	})
	return a, NewTelemeterSender(srv.URL+"/upload", srv.Client(), a, TelemeterSenderOptions{})
}

// The wait for the server's upload window comes before the send, not in
// its duration (phonehome_forward_send_duration_seconds, as its help and
// the README say).
func TestStockTelemeterServerWindowWaitNotInSendDuration(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	clock := &steppingClock{t: time.Now()}
	f := snapshotForwarder(t, srv, clock, Options{})
	s := f.sender.(*TelemeterSender)
	s.pacer.limited, s.pacer.last = true, time.Now() // the server has shown its limiter: a 1s window
	require.NoError(t, f.q.Append(cycleRecord(t, 1)))

	start := time.Now()
	sendQueued(f)
	require.GreaterOrEqual(t, time.Since(start), s.opts.RateLimit*9/10, "the window was waited out")
	var m dto.Metric
	require.NoError(t, f.m.sendDuration.Write(&m))
	require.Equal(t, uint64(1), m.GetHistogram().GetSampleCount())
	require.Less(t, m.GetHistogram().GetSampleSum(), s.opts.RateLimit.Seconds()/2)
}

// The thresholds of superseded: a record more than one and a half intervals
// old is superseded even alone, as docs/migrating-from-telemeter.md states,
// and one queued half an interval or more before the newest is (the doc's
// "a later cycle follows": cycles are at least Interval×(1-Jitter) apart).
func TestSupersededThresholds(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	clock := &steppingClock{t: time.Now().Truncate(time.Second)}
	f := snapshotForwarder(t, srv, clock, Options{}) // Interval: 1m

	queued := clock.now()
	clock.add(90 * time.Second)
	require.False(t, f.superseded(queued), "alone, one and a half intervals old")
	clock.add(time.Millisecond)
	require.True(t, f.superseded(queued), "alone, over one and a half intervals old")

	require.NoError(t, f.q.Append(cycleRecord(t, 1)))
	newest := clock.now()
	require.False(t, f.superseded(newest.Add(-30*time.Second+time.Millisecond)), "under half an interval before the newest")
	require.True(t, f.superseded(newest.Add(-30*time.Second)), "half an interval before the newest")
}

// docs/migrating-from-telemeter.md: a collection waits up to 10s for the
// server's first answer.
func TestLearnServerTimeoutDefault(t *testing.T) {
	var o Options
	o.defaults()
	require.Equal(t, 10*time.Second, o.learnServerTimeout)
}
