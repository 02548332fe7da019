package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/relabel"
)

const (
	fixtureID   = "5f6c2a9e-3b1d-4c7e-9a0f-2d8e4b6c1a73"
	fixtureSalt = "0123456789abcdef-salt"
	hashedID    = "sUTqYf4UzU0SdM5NcdUhdA" // relabel.Anonymize(fixtureSalt, fixtureID), see relabel tests
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("../bench/testdata/" + name) // the one copy of the fixtures
	require.NoError(t, err)
	return b
}

func fixturePolicy(t testing.TB) Policy {
	t.Helper()
	f, err := os.Open("../bench/testdata/telemetry-allowlist.txt")
	require.NoError(t, err)
	defer f.Close()
	al, err := allowlist.ParseReader(f)
	require.NoError(t, err)
	rules, err := relabel.Parse(relabel.Config{
		ID: fixtureID, Salt: []byte(fixtureSalt),
		Rename: map[string]string{"ALERTS": "alerts"},
	})
	require.NoError(t, err)
	return Policy{Allow: al, Rules: rules}
}

// fakePrometheus serves body at /federate, as protobuf if the client asks and proto is set.
func fakePrometheus(t testing.TB, body []byte, proto bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/federate" || len(r.URL.Query()["match[]"]) == 0 {
			http.Error(w, "bad federate request", http.StatusBadRequest)
			return
		}
		if !proto {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write(body)
			return
		}
		format := expfmt.NegotiateAccept(r.Header, expfmt.DefaultAcceptedFormats()...)
		if format.FormatType() != expfmt.TypeProtoDelim {
			http.Error(w, "client did not negotiate protobuf: "+string(format), http.StatusNotAcceptable)
			return
		}
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := tp.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", string(format))
		enc := expfmt.NewEncoder(w, format)
		names := make([]string, 0, len(fams))
		for n := range fams {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			_ = enc.Encode(fams[n])
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// fakeReceiver decodes remote-write 1.0 and 2.0 requests (2.0 ones are
// stored converted to 1.0 in reqs, and as sent in v2); statuses, if set, are
// returned in order before falling back to 204. Set the mode fields before
// the first request.
type fakeReceiver struct {
	mu       sync.Mutex
	reqs     []*prompb.WriteRequest
	v2       []*writev2.Request
	protos   []string // X-Prometheus-Remote-Write-Version of each decoded request
	raw      [][]byte
	headers  []http.Header
	statuses []int
	srv      *httptest.Server

	only1      bool // 415 for 2.0, like a receiver accepting only prometheus.WriteRequest
	noHeaders  bool // never send the written-count headers (a 1.0 receiver)
	badRequest bool // 400 for 2.0, like Prometheus 2.42
	underCount int  // report this many samples fewer than received
}

func newFakeReceiver(t testing.TB, statuses ...int) *fakeReceiver {
	t.Helper()
	fr := &fakeReceiver{statuses: statuses}
	fr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fr.mu.Lock()
		defer fr.mu.Unlock()
		fr.headers = append(fr.headers, r.Header.Clone())
		if len(fr.statuses) > 0 {
			code := fr.statuses[0]
			fr.statuses = fr.statuses[1:]
			if code == http.StatusTooManyRequests {
				w.Header().Set("Retry-After", "7")
			}
			if !fr.noHeaders { // a 2.0 receiver sends the counts on every response
				w.Header().Set("X-Prometheus-Remote-Write-Samples-Written", "0")
			}
			http.Error(w, fmt.Sprintf("status %d from fake", code), code)
			return
		}
		isV2 := r.Header.Get("Content-Type") == contentTypeV2
		switch {
		case isV2 && fr.only1:
			http.Error(w, "unsupported proto", http.StatusUnsupportedMediaType)
			return
		case isV2 && fr.badRequest:
			http.Error(w, "snappy: corrupt input", http.StatusBadRequest)
			return
		}
		raw, err := snappy.Decode(nil, body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req *prompb.WriteRequest
		if isV2 {
			var r2 writev2.Request
			if err := r2.Unmarshal(raw); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if req, err = V2ToV1(&r2); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fr.v2 = append(fr.v2, &r2)
		} else {
			req = &prompb.WriteRequest{}
			if err := req.Unmarshal(raw); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
		}
		fr.raw = append(fr.raw, body, raw)
		fr.reqs = append(fr.reqs, req)
		fr.protos = append(fr.protos, r.Header.Get("X-Prometheus-Remote-Write-Version"))
		if !fr.noHeaders {
			var samples, hists int
			for _, ts := range req.Timeseries {
				samples += len(ts.Samples)
				hists += len(ts.Histograms)
			}
			w.Header().Set("X-Prometheus-Remote-Write-Samples-Written", fmt.Sprint(max(0, samples-fr.underCount)))
			w.Header().Set("X-Prometheus-Remote-Write-Histograms-Written", fmt.Sprint(hists))
			w.Header().Set("X-Prometheus-Remote-Write-Exemplars-Written", "0")
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(fr.srv.Close)
	return fr
}

func (fr *fakeReceiver) series() []prompb.TimeSeries {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	var out []prompb.TimeSeries
	for _, r := range fr.reqs {
		out = append(out, r.Timeseries...)
	}
	return out
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

type harness struct {
	f      *Forwarder
	q      *Queue
	reg    *prometheus.Registry
	recv   *fakeReceiver
	sender *HTTPSender
	sleep  []time.Duration
	mu     sync.Mutex
}

func newHarness(t *testing.T, promURL string, recv *fakeReceiver, dir string, opts Options, fopts FederateOptions) *harness {
	t.Helper()
	return newHarnessWith(t, promURL, recv, dir, opts, fopts, HTTPSenderOptions{}, nil)
}

// newHarnessWith is newHarness with sender options and, if policy is not
// nil, another policy than the fixture's.
func newHarnessWith(t *testing.T, promURL string, recv *fakeReceiver, dir string, opts Options, fopts FederateOptions, sopts HTTPSenderOptions, policy *Policy) *harness {
	t.Helper()
	h := &harness{reg: prometheus.NewRegistry(), recv: recv}
	q, err := OpenQueue(dir, discardLogger(), h.reg, QueueOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	h.q = q
	if policy == nil {
		p := fixturePolicy(t)
		policy = &p
	}
	fopts.Matches = policy.Allow.Selectors()
	src := NewFederator(mustURL(t, promURL), http.DefaultClient, fopts)
	sopts.UserAgent = "phonehome-forwarder/test"
	sopts.Registerer = h.reg
	sender := NewHTTPSender(mustURL(t, recv.srv.URL), http.DefaultClient, sopts)
	h.sender = sender
	if opts.sleep == nil {
		opts.sleep = func(ctx context.Context, d time.Duration) error {
			h.mu.Lock()
			h.sleep = append(h.sleep, d)
			h.mu.Unlock()
			return ctx.Err()
		}
	}
	h.f = New(discardLogger(), h.reg, src, *policy, q, sender, opts)
	return h
}

// deliverAll runs the send loop until the queue is empty.
func (h *harness) deliverAll(t *testing.T) {
	t.Helper()
	sendQueued(h.f)
	n, _ := h.q.Len()
	require.Equal(t, 0, n)
}

func TestCollectAndSendFixture(t *testing.T) {
	fixture := readFixture(t, "federate-sample.prom")
	for _, proto := range []bool{false, true} {
		t.Run(fmt.Sprintf("protobuf=%v", proto), func(t *testing.T) {
			prom := fakePrometheus(t, fixture, proto)
			recv := newFakeReceiver(t)
			h := newHarness(t, prom.URL, recv, t.TempDir(), Options{MaxSamplesPerRequest: 50}, FederateOptions{})
			require.NoError(t, h.f.Collect(context.Background()))
			h.deliverAll(t)

			got := recv.series()
			require.Len(t, got, 224)
			require.Len(t, recv.reqs, 5, "224 samples in requests of at most 50")
			names := map[string]int{}
			for _, ts := range got {
				var id, name string
				for _, l := range ts.Labels {
					switch l.Name {
					case "_id":
						id = l.Value
					case "__name__":
						name = l.Value
					}
				}
				require.Equal(t, hashedID, id)
				names[name]++
				require.Len(t, ts.Samples, 1)
				require.Greater(t, ts.Samples[0].Timestamp, int64(1767225600000), "original 2026 timestamps are kept")
				require.Less(t, ts.Samples[0].Timestamp, int64(1767312000000))
			}
			require.Zero(t, names["ALERTS"])
			require.Positive(t, names["alerts"])
			for _, b := range recv.raw {
				require.False(t, bytes.Contains(b, []byte(fixtureID)), "raw id must never be sent")
			}
			for _, hd := range recv.headers {
				require.Equal(t, "application/x-protobuf;proto=io.prometheus.write.v2.Request", hd.Get("Content-Type"))
				require.Equal(t, "snappy", hd.Get("Content-Encoding"))
				require.Equal(t, "2.0.0", hd.Get("X-Prometheus-Remote-Write-Version"))
				require.Equal(t, "phonehome-forwarder/test", hd.Get("User-Agent"))
			}
			require.Equal(t, 300.0, testutil.ToFloat64(h.f.m.federated))
			require.Equal(t, 76.0, testutil.ToFloat64(h.f.m.filtered.WithLabelValues(ReasonAllowlist)))
			require.Equal(t, 224.0, testutil.ToFloat64(h.f.m.queued))
			require.Equal(t, 224.0, testutil.ToFloat64(h.f.m.sent))
		})
	}
}

// A Prometheus that ignores match[] and returns more than asked must not leak.
func TestAllowlistReenforced(t *testing.T) {
	extra := []byte("secret_metric{a=\"b\"} 1 1767268800000\nup{job=\"x\"} 1 1767268800000\n")
	prom := fakePrometheus(t, extra, false)
	recv := newFakeReceiver(t)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{}, FederateOptions{})
	require.NoError(t, h.f.Collect(context.Background()))
	h.deliverAll(t)
	require.Empty(t, recv.series())
	require.Equal(t, 2.0, testutil.ToFloat64(h.f.m.filtered.WithLabelValues(ReasonAllowlist)))
}

func TestCaps(t *testing.T) {
	fixture := readFixture(t, "federate-sample.prom")
	t.Run("max_series", func(t *testing.T) {
		prom := fakePrometheus(t, fixture, false)
		recv := newFakeReceiver(t)
		h := newHarness(t, prom.URL, recv, t.TempDir(), Options{MaxSeries: 100}, FederateOptions{})
		require.NoError(t, h.f.Collect(context.Background()))
		h.deliverAll(t)
		require.Len(t, recv.series(), 100)
		require.Equal(t, 124.0, testutil.ToFloat64(h.f.m.dropped.WithLabelValues(ReasonMaxSeries)))
	})
	for _, proto := range []bool{false, true} {
		t.Run(fmt.Sprintf("max_bytes/protobuf=%v", proto), func(t *testing.T) {
			prom := fakePrometheus(t, fixture, proto)
			recv := newFakeReceiver(t)
			h := newHarness(t, prom.URL, recv, t.TempDir(), Options{}, FederateOptions{MaxBytes: 20 << 10})
			require.NoError(t, h.f.Collect(context.Background()), "a cap never fails the cycle")
			h.deliverAll(t)
			kept := len(recv.series())
			require.Positive(t, kept)
			require.Less(t, kept, 224)
			over := testutil.ToFloat64(h.f.m.dropped.WithLabelValues(ReasonMaxBytes))
			require.Positive(t, over)
			require.Equal(t, 300.0, testutil.ToFloat64(h.f.m.federated), "every sample is accounted for")
			allow := testutil.ToFloat64(h.f.m.filtered.WithLabelValues(ReasonAllowlist))
			require.Equal(t, 300.0, float64(kept)+over+allow)
		})
	}
}

func TestSenderClassification(t *testing.T) {
	for _, tc := range []struct {
		code       int
		retryable  bool
		retryAfter time.Duration
	}{
		{http.StatusNoContent, false, 0},
		{http.StatusBadRequest, false, 0},
		{http.StatusUnauthorized, false, 0},
		{http.StatusForbidden, false, 0},
		{http.StatusRequestEntityTooLarge, false, 0},
		{http.StatusUnsupportedMediaType, false, 0},
		{http.StatusTooManyRequests, true, 7 * time.Second},
		{http.StatusInternalServerError, true, 0},
		{http.StatusServiceUnavailable, true, 0},
	} {
		t.Run(fmt.Sprint(tc.code), func(t *testing.T) {
			var statuses []int
			if tc.code != http.StatusNoContent {
				statuses = []int{tc.code}
			}
			recv := newFakeReceiver(t, statuses...)
			s := NewHTTPSender(mustURL(t, recv.srv.URL), http.DefaultClient, HTTPSenderOptions{Version: VersionV1})
			err := s.Send(context.Background(), &prompb.WriteRequest{})
			if tc.code == http.StatusNoContent {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			var re RetryableError
			require.Equal(t, tc.retryable, errors.As(err, &re))
			if tc.retryable {
				require.Equal(t, tc.retryAfter, re.RetryAfter)
			}
			var he *HTTPError
			require.ErrorAs(t, err, &he)
			require.Equal(t, tc.code, he.Code)
			require.Contains(t, he.Message, fmt.Sprintf("status %d from fake", tc.code))
		})
	}
	t.Run("network", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		u := mustURL(t, srv.URL)
		srv.Close()
		err := NewHTTPSender(u, http.DefaultClient, HTTPSenderOptions{}).Send(context.Background(), &prompb.WriteRequest{})
		require.ErrorAs(t, err, &RetryableError{})
	})
	t.Run("bearer token", func(t *testing.T) {
		tok := t.TempDir() + "/token"
		require.NoError(t, os.WriteFile(tok, []byte("s3cret\n"), 0o600))
		recv := newFakeReceiver(t)
		s := NewHTTPSender(mustURL(t, recv.srv.URL), http.DefaultClient, HTTPSenderOptions{TokenFile: tok})
		require.NoError(t, s.Send(context.Background(), &prompb.WriteRequest{}))
		require.Equal(t, "Bearer s3cret", recv.headers[0].Get("Authorization"))
	})
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	require.Equal(t, 3*time.Second, parseRetryAfter("3", now))
	require.Equal(t, time.Duration(0), parseRetryAfter("-3", now))
	require.Equal(t, time.Duration(0), parseRetryAfter("soon", now))
	require.Equal(t, 90*time.Second, parseRetryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now))
}

// TestParseRetryAfterHugeIsLong: a Retry-After beyond what a Duration holds
// asks for a long wait (capped by the caller at 10 minutes); it used to wrap
// around, to 290ms for 18446744074 (a retry storm) or to a negative, ignored
// value for 9223372037.
func TestParseRetryAfterHugeIsLong(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, v := range []string{"9223372037", "18446744074", "99999999999999", "99999999999999999999"} {
		require.GreaterOrEqual(t, parseRetryAfter(v, now), 10*time.Minute, "Retry-After: %s", v)
	}
	require.Equal(t, time.Duration(0), parseRetryAfter("-99999999999999999999", now))
}

func TestDeliverRetriesThenSucceeds(t *testing.T) {
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	recv := newFakeReceiver(t, 503, 500, 429)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{MinBackoff: time.Second, MaxBackoff: 4 * time.Second}, FederateOptions{})
	require.NoError(t, h.f.Collect(context.Background()))
	h.deliverAll(t)
	require.Len(t, recv.series(), 224)
	require.Len(t, h.sleep, 3)
	require.GreaterOrEqual(t, h.sleep[0], 500*time.Millisecond)
	require.LessOrEqual(t, h.sleep[0], time.Second)
	require.GreaterOrEqual(t, h.sleep[1], time.Second)
	require.LessOrEqual(t, h.sleep[1], 2*time.Second)
	require.GreaterOrEqual(t, h.sleep[2], 7*time.Second, "Retry-After is honoured")
	require.Less(t, h.sleep[2], 7700*time.Millisecond, "... stretched by up to the 10 % jitter")
	require.Equal(t, 3.0, testutil.ToFloat64(h.f.m.retries))
	require.Equal(t, 1.0, testutil.ToFloat64(h.f.m.requests.WithLabelValues("429")))
}

func TestDeliverDropsOn4xx(t *testing.T) {
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	recv := newFakeReceiver(t, 400)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{MaxSamplesPerRequest: 100}, FederateOptions{})
	require.NoError(t, h.f.Collect(context.Background()))
	h.deliverAll(t)
	require.Len(t, recv.series(), 124, "the first request of 100 is dropped, the rest arrive")
	require.Equal(t, 100.0, testutil.ToFloat64(h.f.m.dropped.WithLabelValues(ReasonHTTP4xx)))
	require.Empty(t, h.sleep, "no retry for 400")
}

func TestBackoffCapped(t *testing.T) {
	f := New(discardLogger(), nil, nil, Policy{}, openTestQueue(t, t.TempDir(), QueueOptions{}), nil,
		Options{MinBackoff: time.Second, MaxBackoff: 8 * time.Second})
	for attempt := range 100 {
		d := f.backoff(attempt)
		want := min(time.Second<<min(attempt, 10), 8*time.Second)
		require.GreaterOrEqual(t, d, want/2, "attempt %d", attempt)
		require.LessOrEqual(t, d, want, "attempt %d", attempt)
	}
}

// TestBackoffLargeMinimum: with a minimum above ~17s, minD<<29 overflows;
// the wait must stay in [d/2, d] of the capped value for every attempt.
func TestBackoffLargeMinimum(t *testing.T) {
	for _, c := range []struct{ minD, maxD time.Duration }{
		{18 * time.Second, 10 * time.Minute}, {30 * time.Second, 10 * time.Minute},
		{time.Minute, time.Hour}, {10 * time.Minute, 10 * time.Minute}, {time.Nanosecond, time.Duration(1<<63 - 1)},
	} {
		for _, attempt := range []int{0, 1, 5, 28, 29, 30, 31, 62, 63, 64, 1000, 1 << 30} {
			want := c.maxD
			if attempt < 63 && float64(c.minD)*math.Pow(2, float64(attempt)) < float64(c.maxD) {
				want = c.minD << attempt
			}
			require.Equal(t, want, cappedExp(attempt, c.minD, c.maxD), "min %v, attempt %d", c.minD, attempt)
			d := Backoff(attempt, c.minD, c.maxD)
			require.GreaterOrEqual(t, d, want/2, "min %v, attempt %d", c.minD, attempt)
			require.LessOrEqual(t, d, want, "min %v, attempt %d", c.minD, attempt)
		}
	}
}

// The receiver is away for several cycles and the forwarder restarts: every
// collected sample is delivered afterwards, in order, with its timestamp.
func TestOutageAndRestartDeliversBacklog(t *testing.T) {
	dir := t.TempDir()
	// A fixture whose timestamps move with each cycle.
	var cycle int
	var mu sync.Mutex
	prom := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		cycle++
		c := cycle
		mu.Unlock()
		b := bytes.ReplaceAll(readFixture(t, "federate-sample.prom"), []byte(" 17672688"), fmt.Appendf(nil, " %d", 17672688+c))
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(b)
	}))
	defer prom.Close()

	down := newFakeReceiver(t)
	down.srv.Close() // connection refused

	h1 := newHarness(t, prom.URL, down, dir, Options{}, FederateOptions{})
	for range 3 {
		require.NoError(t, h1.f.Collect(context.Background()))
	}
	// One delivery attempt fails and is retried after a (fake) sleep that
	// reports cancellation, as at shutdown.
	ctx, cancel := context.WithCancel(context.Background())
	h1.f.opts.sleep = func(context.Context, time.Duration) error { cancel(); return context.Canceled }
	h1.f.sendLoop(ctx, nil)
	require.NoError(t, h1.q.Close())

	// Restart: new queue handle on the same dir, one more cycle, receiver back.
	recv := newFakeReceiver(t)
	h2 := newHarness(t, prom.URL, recv, dir, Options{}, FederateOptions{})
	n, _ := h2.q.Len()
	require.Equal(t, 3, n)
	require.NoError(t, h2.f.Collect(context.Background()))
	h2.deliverAll(t)

	got := recv.series()
	require.Len(t, got, 4*224)
	var last int64
	for i, ts := range got {
		tsMs := ts.Samples[0].Timestamp
		c := int64(i/224) + 1
		require.Equal(t, c, tsMs/100000-17672688, "sample %d comes from cycle %d, oldest first", i, c)
		require.GreaterOrEqual(t, tsMs, last-1000)
		last = tsMs
	}
}

func TestRunCollectsAndFlushesOnShutdown(t *testing.T) {
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	recv := newFakeReceiver(t)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{Interval: 20 * time.Millisecond, sleep: Sleep}, FederateOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- h.f.Run(ctx) }()
	eventually(t, func() bool { return len(recv.series()) >= 2*224 }, "two cycles delivered")
	cancel()
	require.NoError(t, <-done)
	n, _ := h.q.Len()
	require.Equal(t, 0, n, "everything collected was flushed")
	require.Equal(t, testutil.ToFloat64(h.f.m.queued), testutil.ToFloat64(h.f.m.sent))
}

func TestRunFlushIsBounded(t *testing.T) {
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	recv := newFakeReceiver(t, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503, 503)
	h := newHarness(t, prom.URL, recv, t.TempDir(), Options{
		Interval: time.Hour, Jitter: 0.0001, FlushTimeout: 50 * time.Millisecond,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond, sleep: Sleep,
	}, FederateOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- h.f.Run(ctx) }()
	eventually(t, func() bool { return testutil.ToFloat64(h.f.m.retries) >= 1 }, "a retry")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the flush timeout")
	}
	n, _ := h.q.Len()
	require.Equal(t, 1, n, "undelivered data stays queued")
}

func TestFetchLongLinesAndNoTrailingNewline(t *testing.T) {
	long := strings.Repeat("x", 200<<10)
	body := []byte(`up{job="a",big="` + long + `"} 1 1000` + "\n" + `up{job="b"} 2 2000`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	f := NewFederator(mustURL(t, srv.URL), http.DefaultClient, FederateOptions{Matches: []string{"up"}})
	var got []string
	st, err := f.Fetch(context.Background(), func(s *Sample) error {
		got = append(got, fmt.Sprintf("%s %v %d", s.Labels.Get("job"), s.V, s.T))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"a 1 1000", "b 2 2000"}, got)
	require.Equal(t, int64(len(body)), st.Bytes)
}

func TestFetchErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "nope", http.StatusForbidden)
	}))
	defer srv.Close()
	_, err := NewFederator(mustURL(t, srv.URL), http.DefaultClient, FederateOptions{}).Fetch(context.Background(), func(*Sample) error { return nil })
	require.ErrorContains(t, err, "HTTP 403: nope")

	// A failed request names the endpoint and how many selectors, not each
	// of them (a log line, not 20 KB of URL).
	srv.Close()
	_, err = NewFederator(mustURL(t, srv.URL), http.DefaultClient, FederateOptions{}).FetchMatching(context.Background(),
		[]string{"up", `{__name__="csv_succeeded"}`}, func(*Sample) error { return nil })
	require.ErrorContains(t, err, "federate: Get \""+srv.URL+"/federate (2 match[])\"")
	require.NotContains(t, err.Error(), "csv_succeeded")
}

// eventually polls cond every 5ms until it holds, failing after 10s.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-timeout.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestSendLoopSurvivesQueueErrors: dropping an unreadable record, the queue
// may fail to write its cursor (a full disk); the send loop retries after a
// backoff instead of ending delivery for good while the process looks
// healthy.
func TestSendLoopSurvivesQueueErrors(t *testing.T) {
	recv := newFakeReceiver(t)
	dir := t.TempDir()
	var h *harness
	h = newHarness(t, "http://127.0.0.1:1", recv, dir, Options{sleep: func(ctx context.Context, d time.Duration) error {
		h.mu.Lock()
		h.sleep = append(h.sleep, d)
		h.mu.Unlock()
		return os.RemoveAll(filepath.Join(dir, cursorFile)) // the disk has room again
	}}, FederateOptions{})
	rec := encodePayload(1, oneWrite(t))
	require.NoError(t, h.q.Append(rec, rec, rec))

	// Corrupt the first record on disk, and make the cursor unwritable.
	segs, err := filepath.Glob(filepath.Join(dir, "*"+segmentSuffix))
	require.NoError(t, err)
	b, err := os.ReadFile(segs[0])
	require.NoError(t, err)
	b[recordHeaderSize+1] ^= 0xff
	require.NoError(t, os.WriteFile(segs[0], b, 0o640))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, cursorFile)))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, cursorFile, "in-the-way"), 0o750))

	h.deliverAll(t)
	require.Len(t, h.sleep, 1, "one retry after the queue error")
	require.Len(t, recv.reqs, 2, "the two readable records are delivered")
}

// An unset Interval is the --interval default (4m30s), not a busy loop.
func TestIntervalDefault(t *testing.T) {
	var o Options
	o.defaults()
	require.Equal(t, 4*time.Minute+30*time.Second, o.Interval)
}
