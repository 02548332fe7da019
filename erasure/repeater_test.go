package erasure

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/internal/logbuf"
	"github.com/phonehome/phonehome/peers"
)

// The tests below run in a synctest bubble: the Repeater's backoff runs on
// the bubble's clock, which advances whenever every goroutine waits (the
// test on the next call a peer gets).

// scriptedPeers are peers whose answers a test scripts, per peer and path,
// and that send every call they get on calls.
type scriptedPeers struct {
	calls chan string // "addr path authorization"

	mu     sync.Mutex
	peers  []string
	answer func(ctx context.Context, addr, path string) peers.Answer
	bodies map[string][]byte // the last body a retry sent, by path
}

func (f *scriptedPeers) body(path string) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[path]
}

func newScriptedPeers(addrs ...string) *scriptedPeers {
	return &scriptedPeers{calls: make(chan string, 100), peers: addrs}
}

func (f *scriptedPeers) set(addrs []string, answer func(ctx context.Context, addr, path string) peers.Answer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if addrs != nil {
		f.peers = addrs
	}
	if answer != nil {
		f.answer = answer
	}
}

func (f *scriptedPeers) Broadcast(ctx context.Context, path, authorization string, _ []byte) []peers.Answer {
	var out []peers.Answer
	for _, a := range f.Peers() {
		out = append(out, f.Repeat(ctx, a, path, authorization, nil))
	}
	return out
}

func (f *scriptedPeers) Peers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.peers...)
}

func (f *scriptedPeers) Repeat(ctx context.Context, addr, path, authorization string, body []byte) peers.Answer {
	f.calls <- addr + " " + path + " " + authorization
	f.mu.Lock()
	answer := f.answer
	if body != nil {
		if f.bodies == nil {
			f.bodies = map[string][]byte{}
		}
		f.bodies[path] = body
	}
	f.mu.Unlock()
	return answer(ctx, addr, path)
}

func accepted(addr string) peers.Answer {
	return peers.Answer{Peer: addr, Code: http.StatusAccepted, Body: []byte(`{"status":"success","data":{"id":"JOB-` + addr + `"}}`)}
}

func unavailable(addr string) peers.Answer {
	return peers.Answer{Peer: addr, Code: http.StatusServiceUnavailable, Body: []byte(`{"status":"error","error":"not ready"}`)}
}

// repeaterFixture is an Eraser's admin API with a running Repeater over
// scripted peers, in a synctest bubble.
type repeaterFixture struct {
	peers *scriptedPeers
	rp    *Repeater
	reg   *prometheus.Registry
	logs  *logbuf.Buffer
	dir   string
	h     http.Handler
	stop  func() // stops Run and waits for it
}

func newRepeaterFixture(t *testing.T, sp *scriptedPeers) *repeaterFixture {
	t.Helper()
	f := &repeaterFixture{peers: sp, reg: prometheus.NewRegistry(), logs: &logbuf.Buffer{}, dir: filepath.Join(t.TempDir(), "jobs")}
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, f.dir, Options{})
	require.NoError(t, err)
	f.rp = NewRepeater(slog.New(slog.NewTextHandler(f.logs, nil)), f.reg, sp)
	f.h = auth.Middleware(auth.Insecure{Tenant: "acme"}, 0, nil, e.Handler(f.rp))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() { stopped <- f.rp.Run(ctx) }()
	f.stop = sync.OnceFunc(func() {
		cancel()
		require.NoError(t, <-stopped)
	})
	t.Cleanup(f.stop)
	return f
}

// newDownPeerFixture is a repeaterFixture whose one peer, c:9291, answers
// every call 503.
func newDownPeerFixture(t *testing.T) (*scriptedPeers, *repeaterFixture) {
	t.Helper()
	sp := newScriptedPeers("c:9291")
	sp.set(nil, func(_ context.Context, addr, _ string) peers.Answer { return unavailable(addr) })
	return sp, newRepeaterFixture(t, sp)
}

// post makes an admin call and returns its answer's warnings.
func (f *repeaterFixture) post(t *testing.T, path, body string) []string {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer adm1n-s3cret")
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	require.Less(t, rec.Code, 300, rec.Body.String())
	var env struct{ Warnings []string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &env))
	return env.Warnings
}

func (f *repeaterFixture) repeats(result string) float64 {
	return testutil.ToFloat64(f.rp.m.repeats.WithLabelValues(result))
}

// TestRepeaterDeliversToAReplicaThatWasDown: a replica that answers 503
// (and then refuses connections) when an erasure is posted gets it from a
// retry once it is back, 5 s and then 10 s later; the replica that took it
// at once is not called again. The answer said it would be retried and
// where to check; the delivery is logged and counted.
func TestRepeaterDeliversToAReplicaThatWasDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp := newScriptedPeers("b:9291", "c:9291")
		var cCalls int
		sp.set(nil, func(_ context.Context, addr, _ string) peers.Answer {
			if addr == "b:9291" {
				return accepted(addr)
			}
			cCalls++
			switch cCalls {
			case 1:
				return unavailable(addr)
			case 2:
				return peers.Answer{Peer: addr, Err: errors.New("connection refused")}
			}
			return accepted(addr)
		})
		f := newRepeaterFixture(t, sp)
		start := time.Now()
		warnings := f.post(t, erasePath, `{"cluster_id":"c1"}`)
		require.Len(t, warnings, 1)
		require.Contains(t, warnings[0], "replica c:9291 did not take it (503: not ready): this replica retries it there for up to 1h0m0s; its job appears in GET /api/v1/admin/erase on that replica")
		require.Equal(t, "b:9291 /api/v1/admin/erase Bearer adm1n-s3cret", <-sp.calls)
		require.Equal(t, "c:9291 /api/v1/admin/erase Bearer adm1n-s3cret", <-sp.calls)
		require.Equal(t, 1.0, testutil.ToFloat64(f.rp.m.pending))

		require.Equal(t, "c:9291 /api/v1/admin/erase Bearer adm1n-s3cret", <-sp.calls)
		require.Equal(t, 5*time.Second, time.Since(start))
		require.Equal(t, "c:9291 /api/v1/admin/erase Bearer adm1n-s3cret", <-sp.calls)
		require.Equal(t, 15*time.Second, time.Since(start), "the wait doubles")
		synctest.Wait()
		require.Empty(t, sp.calls, "delivered: no more calls")
		require.Equal(t, 0.0, testutil.ToFloat64(f.rp.m.pending))
		require.Equal(t, 2.0, f.repeats("delivered"))
		require.Equal(t, 2.0, f.repeats("failed"))
		require.Contains(t, f.logs.String(), `level=INFO msg="admin call repeated on a replica that had missed it" replica=c:9291 path=/api/v1/admin/erase tenant=acme`)
		require.Contains(t, f.logs.String(), "job=JOB-c:9291")
	})
}

// TestRepeaterBacksOffToAMinute: the wait doubles up to a minute.
func TestRepeaterBacksOffToAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, f := newDownPeerFixture(t)
		f.post(t, readmitPath, `{"cluster_id":"c1"}`)
		<-sp.calls
		var waits []time.Duration
		for range 6 {
			before := time.Now()
			<-sp.calls
			waits = append(waits, time.Since(before))
		}
		require.Equal(t, []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, time.Minute, time.Minute}, waits)
	})
}

// TestRepeaterStopsAtADefiniteRefusal: a 4xx other than 408 and 429 will
// not change with a retry: it ends the retries, with a warning in the log.
// A 429 is retried.
func TestRepeaterStopsAtADefiniteRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp := newScriptedPeers("c:9291")
		n := 0
		sp.set(nil, func(_ context.Context, addr, _ string) peers.Answer {
			n++
			if n == 1 {
				return peers.Answer{Peer: addr, Code: http.StatusTooManyRequests, Body: []byte(`{"status":"error","error":"slow down"}`)}
			}
			return peers.Answer{Peer: addr, Code: http.StatusForbidden, Body: []byte(`{"status":"error","error":"forbidden"}`)}
		})
		f := newRepeaterFixture(t, sp)
		warnings := f.post(t, erasePath, `{"cluster_id":"c1"}`)
		require.Contains(t, warnings[0], "(429: slow down): this replica retries it")
		<-sp.calls
		<-sp.calls
		synctest.Wait()
		require.Empty(t, sp.calls, "refused for good: not retried")
		require.Equal(t, 0.0, testutil.ToFloat64(f.rp.m.pending))
		require.Equal(t, 1.0, f.repeats("refused"))
		require.Contains(t, f.logs.String(), `level=WARN msg="admin call repeat refused; not retried`)
		require.Contains(t, f.logs.String(), `err="403: forbidden"`)
	})
}

// TestRepeaterNewerCallSupersedes: a re-admission posted while an erasure
// of the same cluster is retried on a replica drops that retry, after the
// attempt in flight has returned, so the replica never gets the erasure
// after the re-admission; the re-admission is retried in its place. A
// pending erasure of another cluster stays.
func TestRepeaterNewerCallSupersedes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp := newScriptedPeers("c:9291")
		inFlight, release, returned := make(chan struct{}), make(chan struct{}), make(chan string, 10)
		sp.set(nil, func(ctx context.Context, addr, path string) peers.Answer {
			select {
			case <-inFlight: // closed: the next attempts hang until cancelled or released
			default:
				return unavailable(addr)
			}
			select {
			case <-ctx.Done():
				returned <- path
				return peers.Answer{Peer: addr, Err: ctx.Err()}
			case <-release:
				return unavailable(addr)
			}
		})
		f := newRepeaterFixture(t, sp)
		f.post(t, readmitPath, `{"cluster_id":"c1"}`)
		f.post(t, erasePath, `{"cluster_id":"c2"}`)
		<-sp.calls
		<-sp.calls
		close(inFlight)
		<-sp.calls // both retries in flight, hanging
		<-sp.calls
		synctest.Wait()

		sp.set(nil, func(_ context.Context, addr, path string) peers.Answer { return unavailable(addr) })
		f.post(t, erasePath, `{"cluster_id":"c1"}`)
		require.Len(t, returned, 1, "the re-admission's attempt had returned before the erasure was repeated")
		close(release) // c2's
		require.Equal(t, "c:9291 /api/v1/admin/erase Bearer adm1n-s3cret", <-sp.calls)
		require.Equal(t, 1.0, f.repeats("superseded"))
		require.Equal(t, 2.0, testutil.ToFloat64(f.rp.m.pending), "c2's erasure and c1's")
		require.Contains(t, f.logs.String(), "admin call repeat superseded by a newer call for the cluster")

		var got []string
		sp.set(nil, func(_ context.Context, addr, _ string) peers.Answer { return accepted(addr) })
		got = append(got, <-sp.calls, <-sp.calls)
		synctest.Wait()
		require.Empty(t, sp.calls)
		require.ElementsMatch(t, []string{"c:9291 /api/v1/admin/erase Bearer adm1n-s3cret", "c:9291 /api/v1/admin/erase Bearer adm1n-s3cret"}, got, "c1's and c2's erasures")
		require.Equal(t, 0.0, testutil.ToFloat64(f.rp.m.pending))
	})
}

// TestRepeaterReadmissionKeepsAPendingErasure: a replica that missed an
// erasure and then its cluster's re-admission must still erase it, and
// not deny it: the re-admission does not drop the pending erasure, which is
// sent without its deny from then on, with no attempt of the old one in
// flight.
func TestRepeaterReadmissionKeepsAPendingErasure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, f := newDownPeerFixture(t)
		f.post(t, erasePath, `{"cluster_id":"c1"}`)
		<-sp.calls
		f.post(t, readmitPath, `{"cluster_id":"c1"}`)
		<-sp.calls
		require.Zero(t, f.repeats("superseded"))
		require.Equal(t, 2.0, testutil.ToFloat64(f.rp.m.pending))

		sp.set(nil, func(_ context.Context, addr, _ string) peers.Answer { return accepted(addr) })
		got := []string{<-sp.calls, <-sp.calls}
		synctest.Wait()
		require.ElementsMatch(t, []string{"c:9291 /api/v1/admin/erase Bearer adm1n-s3cret", "c:9291 /api/v1/admin/readmit Bearer adm1n-s3cret"}, got)
		require.Equal(t, 0.0, testutil.ToFloat64(f.rp.m.pending))
		var erase Request
		require.NoError(t, json.Unmarshal(sp.body(erasePath), &erase))
		require.Equal(t, "c1", erase.ClusterID)
		require.NotNil(t, erase.Deny)
		require.False(t, *erase.Deny, "erased there, not denied")
	})
}

// TestRepeaterReadmissionKeepsAPendingErasureWithoutDeny: an erasure
// posted with "deny": false is kept by a re-admission of its cluster too: a
// replica that missed both must still erase the cluster's data.
func TestRepeaterReadmissionKeepsAPendingErasureWithoutDeny(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, f := newDownPeerFixture(t)
		f.post(t, erasePath, `{"cluster_id":"c1","deny":false}`)
		<-sp.calls
		f.post(t, readmitPath, `{"cluster_id":"c1"}`)
		<-sp.calls
		require.Zero(t, f.repeats("superseded"))

		sp.set(nil, func(_ context.Context, addr, _ string) peers.Answer { return accepted(addr) })
		got := []string{<-sp.calls, <-sp.calls}
		synctest.Wait()
		require.ElementsMatch(t, []string{"c:9291 /api/v1/admin/erase Bearer adm1n-s3cret", "c:9291 /api/v1/admin/readmit Bearer adm1n-s3cret"}, got)
		var erase Request
		require.NoError(t, json.Unmarshal(sp.body(erasePath), &erase))
		require.NotNil(t, erase.Deny)
		require.False(t, *erase.Deny)
	})
}

// TestRepeaterStopsWithTheProcess: Run returns once its context ends,
// with the retries stopped (goleak checks none is left) and logged, and a
// call taken afterwards says it is not retried.
func TestRepeaterStopsWithTheProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, f := newDownPeerFixture(t)
		f.post(t, erasePath, `{"cluster_id":"c1"}`)
		<-sp.calls
		<-sp.calls // a retry
		f.stop()
		require.Equal(t, 0.0, testutil.ToFloat64(f.rp.m.pending))
		require.Contains(t, f.logs.String(), `level=WARN msg="admin call repeat stopped with the receiver`)
		require.Contains(t, f.logs.String(), `replicas=[c:9291]`)

		warnings := f.post(t, erasePath, `{"cluster_id":"c1"}`)
		require.Contains(t, warnings[0], "this replica is stopping: send it to that replica again")
		<-sp.calls
		synctest.Wait()
		require.Empty(t, sp.calls)
	})
}

// TestRepeaterGivesUpAfterAnHourAndKeepsNoCredentialOnDisk: the caller's
// credential is in no file of the erasure directory while the call is
// retried; after an hour the retries stop, with a warning and a count.
func TestRepeaterGivesUpAfterAnHourAndKeepsNoCredentialOnDisk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, f := newDownPeerFixture(t)
		start := time.Now()
		f.post(t, erasePath, `{"cluster_id":"c1"}`)
		<-sp.calls
		<-sp.calls
		files := 0
		require.NoError(t, filepath.WalkDir(filepath.Dir(f.dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			files++
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			require.NotContains(t, string(b), "s3cret", path)
			return nil
		}))
		require.Positive(t, files, "the job's state file")

		advance(time.Hour - time.Since(start))
		require.Equal(t, 0.0, testutil.ToFloat64(f.rp.m.pending))
		require.Equal(t, 1.0, f.repeats("expired"))
		require.Contains(t, f.logs.String(), `level=WARN msg="admin call repeat given up: replicas did not take it in time; send it to them"`)
		require.Contains(t, f.logs.String(), "replicas=[c:9291]")
	})
}

// TestRepeaterFollowsAReplicaToItsNewAddress: a replica that misses the
// call and leaves discovery (a restarted pod) is not retried, but the call
// waits for a peer that joins in its place and repeats it there.
func TestRepeaterFollowsAReplicaToItsNewAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp := newScriptedPeers("b:9291", "c:9291")
		sp.set(nil, func(_ context.Context, addr, _ string) peers.Answer {
			if addr == "c:9291" {
				return peers.Answer{Peer: addr, Err: errors.New("i/o timeout")}
			}
			return accepted(addr)
		})
		f := newRepeaterFixture(t, sp)
		f.post(t, erasePath, `{"cluster_id":"c1"}`)
		<-sp.calls
		<-sp.calls
		sp.set([]string{"b:9291"}, nil) // c's pod is gone
		advance(5 * time.Second)
		require.Contains(t, f.logs.String(), "replica left the peers without taking an admin call; waiting for one that joins in its place")
		advance(10 * time.Minute)
		require.Empty(t, sp.calls, "neither b (took it) nor c (gone) is called")
		require.Equal(t, 1.0, testutil.ToFloat64(f.rp.m.pending), "waiting for c's replacement")

		sp.set([]string{"b:9291", "d:9291"}, nil) // its new address
		require.Equal(t, "d:9291 /api/v1/admin/erase Bearer adm1n-s3cret", <-sp.calls)
		synctest.Wait()
		require.Equal(t, 0.0, testutil.ToFloat64(f.rp.m.pending))
		require.Contains(t, f.logs.String(), "replica=d:9291")
		require.Contains(t, f.logs.String(), "in_place_of=c:9291")
	})
}

// advance moves a synctest bubble's clock by d (it never waits: the clock
// jumps while every goroutine of the bubble waits) and lets the goroutines
// woken settle.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// TestRepeaterCallRepeatedHereSupersedes: an erasure that another replica
// repeats here drops this replica's pending retry of the re-admission of
// that cluster (the other replica repeats the erasure on the peers this one
// retries), and is not repeated from here.
func TestRepeaterCallRepeatedHereSupersedes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, f := newDownPeerFixture(t)
		f.post(t, readmitPath, `{"cluster_id":"c1"}`)
		<-sp.calls
		require.Equal(t, 1.0, testutil.ToFloat64(f.rp.m.pending))

		req := httptest.NewRequest(http.MethodPost, erasePath, strings.NewReader(`{"cluster_id":"c1"}`))
		req.Header.Set(peers.OriginHeader, "b0b")
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
		require.Equal(t, 0.0, testutil.ToFloat64(f.rp.m.pending))
		require.Equal(t, 1.0, f.repeats("superseded"))
		advance(time.Hour)
		require.Empty(t, sp.calls, "neither retried nor repeated")
	})
}
