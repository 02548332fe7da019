package receive

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// TestHandlerMaxInflightBytesFirstComeFirstServed: a write that does not
// fit in --receive.max-inflight-bytes next to the one in flight waits for
// it instead of being refused, and a smaller write that comes after it and
// would fit queues behind it instead of taking the memory it waits for
// (which, repeated, starved a write close to the limit).
func TestHandlerMaxInflightBytesFirstComeFirstServed(t *testing.T) {
	w := &blockingWriter{entered: make(chan struct{}, 3), release: make(chan struct{}, 3)}
	reg := prometheus.NewRegistry()
	h := NewHandler(discard(), reg, w, newLimiter(nil), Options{MaxInflightBytes: 1 << 30})
	h.bytes.wait = time.Minute // never runs out here
	serve := func(c string, series []prompb.TimeSeries) <-chan int {
		code := make(chan int, 1)
		go func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, newRequest(encode(t, series...), &auth.Identity{Tenant: "a", ClusterID: c}))
			code <- rec.Code
		}()
		return code
	}
	first := serve("c1", manySeries("c1", 0, 2000))
	within(t, w.entered)
	// c1 is held in storage, done reserving: leave room for a small
	// write's first step next to it.
	h.bytes.max = h.bytes.used.Load() + 2*reserveStep

	rnd := rand.New(rand.NewPCG(1, 2))
	var incompressible []prompb.TimeSeries
	for i := range 2000 {
		incompressible = append(incompressible, series("csv_succeeded", "_id", "c2", "name", fmt.Sprintf("op-%04d-%x", i, rnd.Uint64()), "reason", fmt.Sprintf("%x%x%x%x", rnd.Uint64(), rnd.Uint64(), rnd.Uint64(), rnd.Uint64())))
	}
	require.Greater(t, len(encode(t, incompressible...)), 2*reserveStep, "c2's body alone does not fit")
	large := serve("c2", incompressible)
	require.Eventually(t, func() bool { return h.bytes.waiting() == 1 }, 10*time.Second, time.Millisecond, "c2 waits")
	small := serve("c3", manySeries("c3", 0, 1)) // fits next to c1
	require.Eventually(t, func() bool { return h.bytes.waiting() == 2 }, 10*time.Second, time.Millisecond, "c3 queues behind c2")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP phonehome_receive_inflight_bytes_waiting_requests Write requests waiting for --receive.max-inflight-bytes to admit them (or to let them grow), up to 5s each.
# TYPE phonehome_receive_inflight_bytes_waiting_requests gauge
phonehome_receive_inflight_bytes_waiting_requests 2
`), "phonehome_receive_inflight_bytes_waiting_requests"))
	select {
	case code := <-large:
		t.Fatalf("c2 answered %d while c1 holds the memory it needs", code)
	case code := <-small:
		t.Fatalf("c3 answered %d before c2, which came first", code)
	default:
	}

	for range 3 {
		w.release <- struct{}{}
	}
	require.Equal(t, http.StatusNoContent, within(t, first))
	require.Equal(t, http.StatusNoContent, within(t, large), "c2 was served, not starved")
	require.Equal(t, http.StatusNoContent, within(t, small))
	require.Zero(t, h.bytes.used.Load())
	require.Zero(t, h.bytes.waiting())
}

// TestInflightBytesQueueInOrder: writes that wait are admitted in the order
// they came, each once what it asks fits; none overtakes another.
func TestInflightBytesQueueInOrder(t *testing.T) {
	b := &inflightBytes{max: 100, wait: time.Minute}
	holder := &reservation{pool: b}
	require.True(t, b.take(holder, 60))
	large, small := &reservation{pool: b}, &reservation{pool: b}
	took := make(chan bool, 2)
	go func() { took <- b.take(large, 50) }()
	require.Eventually(t, func() bool { return b.waiting() == 1 }, 10*time.Second, time.Millisecond)
	go func() { took <- b.take(small, 10) }()
	require.Eventually(t, func() bool { return b.waiting() == 2 }, 10*time.Second, time.Millisecond)
	require.Equal(t, int64(60), b.used.Load(), "the small one fits, yet waits its turn")

	holder.release()
	require.True(t, within(t, took))
	require.True(t, within(t, took))
	require.Less(t, large.seq, small.seq, "admitted in the order they came")
	require.Equal(t, int64(60), b.used.Load())
}

// TestInflightBytesOldestGrows: a write in flight that cannot grow waits
// ahead of the queue if it is the oldest in flight; a younger one gives way
// (refused at once), so two growers never wait for each other.
func TestInflightBytesOldestGrows(t *testing.T) {
	b := &inflightBytes{max: 100, wait: time.Minute}
	old, young, later := &reservation{pool: b}, &reservation{pool: b}, &reservation{pool: b}
	require.True(t, b.take(old, 50))
	require.True(t, b.take(young, 30))
	require.True(t, b.take(young, 10), "a write in flight grows while it fits")

	youngGrew := make(chan bool, 1)
	go func() { youngGrew <- b.take(young, 20) }()
	require.Eventually(t, func() bool { return b.waiting() == 1 }, 10*time.Second, time.Millisecond)
	laterTook := make(chan bool, 1)
	go func() { laterTook <- b.take(later, 5) }()
	require.Eventually(t, func() bool { return b.waiting() == 2 }, 10*time.Second, time.Millisecond, "a new write queues behind the grower")

	oldGrew := make(chan bool, 1)
	go func() { oldGrew <- b.take(old, 20) }()
	require.False(t, within(t, youngGrew), "the younger grower gives way to the older")
	require.False(t, b.take(young, 20), "and does not wait while the older one does")
	young.release()
	require.True(t, within(t, oldGrew))
	require.True(t, within(t, laterTook))
	require.Equal(t, int64(75), b.used.Load())
}

// TestInflightBytesWaitIsBounded: a write waits at most its wait, or until
// its request's context ends, and is then refused without holding up the
// writes behind it.
func TestInflightBytesWaitIsBounded(t *testing.T) {
	b := &inflightBytes{max: 100, wait: time.Millisecond}
	holder := &reservation{pool: b}
	require.True(t, b.take(holder, 90))
	require.False(t, b.take(&reservation{pool: b}, 20), "refused once its wait ran out")
	require.Zero(t, b.waiting())

	b.wait = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	took := make(chan bool, 1)
	go func() { took <- b.take(&reservation{pool: b, ctx: ctx}, 20) }()
	require.Eventually(t, func() bool { return b.waiting() == 1 }, 10*time.Second, time.Millisecond)
	behind := make(chan bool, 1)
	go func() { behind <- b.take(&reservation{pool: b}, 10) }()
	require.Eventually(t, func() bool { return b.waiting() == 2 }, 10*time.Second, time.Millisecond)
	cancel() // its client left
	require.False(t, within(t, took))
	require.True(t, within(t, behind), "admitted once the write ahead of it left")
	require.Equal(t, int64(100), b.used.Load())
}
