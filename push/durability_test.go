package push

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

var errDisk = errors.New("input/output error")

// faultyFile is the push log's file with an injected Sync; the rest goes to
// the real file.
type faultyFile struct {
	logFileIO
	sync func() error
}

func (f *faultyFile) Sync() error {
	if err := f.sync(); err != nil {
		return err
	}
	return f.logFileIO.Sync()
}

// injectSync makes the log's Syncs go through fn, until the log is rewritten
// after a failure (which opens the file afresh).
func (f *fixture) injectSync(fn func() error) {
	f.gw.mu.Lock()
	defer f.gw.mu.Unlock()
	f.gw.log.f = &faultyFile{logFileIO: f.gw.log.f, sync: fn}
}

// pushAsync pushes counterText from another goroutine and sends the status
// code (0 on a transport error).
func (f *fixture) pushAsync(token string) <-chan int {
	c := make(chan int, 1)
	url, client := f.srv.URL+"/metrics/job/i", f.srv.Client()
	go func() {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(counterText))
		if err != nil {
			c <- 0
			return
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			c <- 0
			return
		}
		_ = resp.Body.Close()
		c <- resp.StatusCode
	}()
	return c
}

func (f *fixture) waitSeq(seq uint64) {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		f.gw.mu.Lock()
		defer f.gw.mu.Unlock()
		return f.gw.seq == seq
	}, 10*time.Second, time.Millisecond)
}

const awsKey = `{__name__="installs_total", job="i", platform="aws", result="ok"}`

// A push whose fsync fails is answered 500 and counts nowhere: not in
// memory, not in the TSDB, not in a snapshot, not after a restart. The log
// is rewritten from the acknowledged state at once, so the client's retry is
// accepted and counts once.
func TestPushFailedFsyncIsNotCounted(t *testing.T) {
	f := newFixture(t, testConfig())
	code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusOK, code, body)

	var fail atomic.Bool
	fail.Store(true)
	f.injectSync(func() error {
		if fail.CompareAndSwap(true, false) {
			return errDisk
		}
		return nil
	})
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusInternalServerError, code, body)
	require.Equal(t, 1.0, f.state("acme")[awsKey], "the refused push is not flushed")
	require.Contains(t, body, "push not stored")

	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText) // the retry
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 2.0, f.state("acme")[awsKey])
	require.Equal(t, 1.0, testutil.ToFloat64(f.gw.metrics.logFailures))
	require.Equal(t, 1.0, testutil.ToFloat64(f.gw.metrics.recoveries.WithLabelValues("success")))
	require.Equal(t, 0.0, testutil.ToFloat64(f.gw.metrics.logUnusable))
	require.Equal(t, 2.0, testutil.ToFloat64(f.gw.metrics.acceptedPushes))

	f.reopen()
	require.Equal(t, 2.0, f.state("acme")[awsKey], "replay: the refused push is not in the log or the snapshot")
}

// Records that share a failed fsync are all refused, and so are the records
// written while it ran (the file is no longer trusted): none is applied.
// The group before it, whose fsync succeeded, counts.
func TestPushFailedFsyncRefusesItsWholeGroup(t *testing.T) {
	cfg := testConfig()
	cfg.RateLimit = RateLimit{RequestsPerSecond: 1e6, Burst: 1e6}
	f := newFixture(t, cfg)
	syncs := make(chan chan error)
	var failed atomic.Bool
	var resetSyncs atomic.Int32
	f.injectSync(func() error { // each fsync waits for the test to decide its result
		if failed.Load() { // the reset's fsync of the cut (durableLog.cut)
			resetSyncs.Add(1)
			return nil
		}
		c := make(chan error)
		syncs <- c
		return <-c
	})

	a := f.pushAsync("tok-a")
	syncA := <-syncs // a's fsync runs: the group {a} is closed
	b, c := f.pushAsync("tok-a"), f.pushAsync("tok-a")
	f.waitSeq(3) // b and c are written: the next group
	syncA <- nil
	require.Equal(t, http.StatusOK, <-a)

	syncBC := <-syncs // one fsync for b and c
	d := f.pushAsync("tok-a")
	f.waitSeq(4) // written while the fsync runs
	failed.Store(true)
	syncBC <- errDisk
	for _, ch := range []<-chan int{b, c, d} {
		require.Equal(t, http.StatusInternalServerError, <-ch)
	}
	require.Equal(t, int32(1), resetSyncs.Load(), "the cut back to a is fsynced, once")
	require.Equal(t, 1.0, f.state("acme")[awsKey], "only a counts")

	code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 2.0, f.state("acme")[awsKey])
	f.reopen()
	require.Equal(t, 2.0, f.state("acme")[awsKey])
	require.Equal(t, 4.0, f.state("acme")[`{__name__="installs_total", job="i", platform="gcp", result="fail"}`])
}

// If the log cannot be rewritten after a failed fsync either, pushes get 503
// until it can, and the refused record is not replayed by a restart (the log
// was cut back to what was durable). A later Flush rewrites it.
func TestPushFailedFsyncAndRewrite(t *testing.T) {
	f := newFixture(t, testConfig())
	code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusOK, code, body)

	// A directory where the snapshot goes: writing it fails. (Phase 2
	// removes the snapshot file, which the rewrite replaces before any
	// restart.)
	snap := filepath.Join(f.dir, snapshotFile)
	blockSnapshot := func() {
		require.NoError(t, os.RemoveAll(snap))
		require.NoError(t, os.MkdirAll(filepath.Join(snap, "x"), 0o750))
	}
	blockSnapshot()
	f.injectSync(func() error { return errDisk })
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusInternalServerError, code, body)
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Equal(t, 1.0, testutil.ToFloat64(f.gw.metrics.logUnusable))
	require.Equal(t, 1.0, testutil.ToFloat64(f.gw.metrics.recoveries.WithLabelValues("failure")))

	// A restart before any rewrite: only the acknowledged push is replayed.
	f.close()
	require.NoError(t, os.RemoveAll(snap))
	f.w = &fakeWriter{}
	f.open()
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 2.0, f.state("acme")[awsKey])

	// Without a restart: the flush after the disk is back rewrites the log.
	blockSnapshot()
	f.injectSync(func() error { return errDisk })
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusInternalServerError, code, body)
	f.gw.Flush(context.Background()) // still failing: no change
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.NoError(t, os.RemoveAll(snap))
	require.Equal(t, 2.0, f.state("acme")[awsKey], "the flush rewrote the log")
	require.Equal(t, 0.0, testutil.ToFloat64(f.gw.metrics.logUnusable))
	code, body, _ = f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(t, http.StatusOK, code, body)
	f.reopen()
	require.Equal(t, 3.0, f.state("acme")[awsKey])
}
