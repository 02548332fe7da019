package push

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

const gcpKey = `{__name__="installs_total", job="i", platform="gcp", result="fail"}`

// pushOK pushes counterText (aws +1, gcp +2) and requires a 200.
func (f *fixture) pushOK() {
	f.t.Helper()
	code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
	require.Equal(f.t, http.StatusOK, code, body)
}

// requireCounted requires the tenant's aggregate to hold n pushes of
// counterText, no more, no fewer.
func (f *fixture) requireCounted(n int, msgAndArgs ...any) {
	f.t.Helper()
	st := f.state("acme")
	require.Equal(f.t, map[string]float64{awsKey: float64(n), gcpKey: float64(2 * n)}, st, msgAndArgs...)
}

// stateFiles reads the snapshot's Seq and the Seqs of the log's records in
// dir, in file order.
func stateFiles(t *testing.T, dir string) (snapSeq uint64, logSeqs []uint64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, snapshotFile))
	require.NoError(t, err)
	var s snapshot
	require.NoError(t, json.Unmarshal(b, &s))
	lf, err := os.Open(filepath.Join(dir, logFile))
	require.NoError(t, err)
	defer lf.Close()
	_, _, _, err = replay(lf, 0, func(rec *record) { logSeqs = append(logSeqs, rec.Seq) })
	require.NoError(t, err)
	return s.Seq, logSeqs
}

// flushPause holds a Flush, run in another goroutine (start), at a seam
// the test installs to call hold, until resume; or for 10 s at most, after
// which resume fails the test: its pushes or reads waited for the held
// flush (they would hang otherwise).
type flushPause struct {
	t                      *testing.T
	reached, released      chan struct{}
	reachOnce, releaseOnce sync.Once
	waited                 atomic.Bool
	flushed                chan struct{}
}

func newFlushPause(t *testing.T) *flushPause {
	return &flushPause{t: t, reached: make(chan struct{}), released: make(chan struct{}), flushed: make(chan struct{})}
}

// hold is what the seam calls: it blocks the flush until resume.
func (p *flushPause) hold() {
	p.reachOnce.Do(func() { close(p.reached) })
	<-p.released
}

func (p *flushPause) release() { p.releaseOnce.Do(func() { close(p.released) }) }

// start runs g.Flush in another goroutine and returns once it is held at
// the seam (what names it).
func (p *flushPause) start(g *Gateway, what string) {
	p.t.Helper()
	watchdog := time.AfterFunc(10*time.Second, func() { p.waited.Store(true); p.release() })
	p.t.Cleanup(func() {
		watchdog.Stop()
		p.release()
		<-p.flushed
	})
	go func() {
		defer close(p.flushed)
		g.Flush(context.Background())
	}()
	select {
	case <-p.reached:
	case <-time.After(10 * time.Second):
		p.t.Fatalf("the flush did not reach %s", what)
	}
}

// resume lets the held flush go on, and waits for its end.
func (p *flushPause) resume() {
	p.t.Helper()
	require.False(p.t, p.waited.Load(), "a push or a read waited for the held flush")
	p.release()
	<-p.flushed
}

// A flush writes the snapshot without the Gateway's mutex: while its write
// is paused, a push is acknowledged and the state is read. The push is kept
// in the log, after the snapshot's Seq, and counts once after a restart.
func TestFlushWritesTheSnapshotOutsideTheMutex(t *testing.T) {
	f := newFixture(t, testConfig())
	f.pushOK()
	f.gw.Flush(context.Background())
	f.pushOK() // the log needs compacting

	p := newFlushPause(t)
	f.gw.flushStep = func(s flushStep) {
		if s == stepEncoded { // in the write, between encoding and writing
			p.hold()
		}
	}
	p.start(f.gw, "the snapshot's write")
	f.pushOK()
	n, err := testutil.GatherAndCount(f.reg, "phonehome_push_series") // /metrics reads the state
	require.NoError(t, err)
	require.Equal(t, 1, n)
	p.resume()
	require.Equal(t, 2.0, testutil.ToFloat64(f.gw.metrics.compactions.WithLabelValues("success")))

	snapSeq, logSeqs := stateFiles(t, f.dir)
	require.Equal(t, []uint64{snapSeq + 1}, logSeqs, "the log holds the push made during the write, and only it")
	f.pushOK() // appended to the log in place
	f.reopen()
	f.requireCounted(4)
}

// A crash at any point of a flush whose snapshot write runs concurrently
// with pushes loses no acknowledged push and counts none twice. The log is
// a crashFile until the flush replaces it, so what a crash leaves of it is
// what was fsynced (a machine crash); the snapshot is written by atomicfile.
// Each kill point is a copy of what a crash would leave, restarted from.
func TestFlushCrashAtEveryStepWithConcurrentPushes(t *testing.T) {
	cfg := testConfig()
	cfg.RateLimit = RateLimit{RequestsPerSecond: 1e6, Burst: 1e6}
	f := newFixture(t, cfg)
	f.pushOK()
	f.pushOK()
	f.gw.Flush(context.Background()) // a snapshot, the log emptied
	f.pushOK()
	acked := 3

	logPath, snapPath := filepath.Join(f.dir, logFile), filepath.Join(f.dir, snapshotFile)
	cf, _ := f.crashLog(0)

	type crash struct {
		name      string
		snap, log []byte
		acked     int
	}
	var crashes []crash
	replaced := false // the flush renamed its own file over the crashFile
	kill := func(name string) {
		snap, err := os.ReadFile(snapPath)
		require.NoError(t, err)
		c := crash{name: name, snap: snap, acked: acked}
		if replaced {
			c.log, err = os.ReadFile(logPath) // written by atomicfile, then acknowledged (fsynced) records
			require.NoError(t, err)
		} else {
			cf.mu.Lock()
			c.log = append([]byte(nil), cf.disk...)
			cf.mu.Unlock()
		}
		crashes = append(crashes, c)
	}
	// The hook runs on this goroutine (Flush below): the pushes it makes
	// while the write runs are concurrent with the flush.
	f.gw.flushStep = func(s flushStep) {
		switch s {
		case stepCopied:
			kill("copied")
		case stepEncoded:
			kill("encoded")
			f.pushOK()
			f.pushOK()
			acked += 2
			kill("encoded, 2 pushes since")
		case stepPrepared:
			f.pushOK()
			acked++
			kill("snapshot written, not in place")
		case stepInstalled:
			kill("snapshot in place, log not cut")
		case stepCut:
			replaced = true
			kill("log cut")
		}
	}
	f.gw.Flush(context.Background())
	f.gw.flushStep = func(flushStep) {}
	require.True(t, replaced, "the flush cut the log")
	kill("flushed")
	f.pushOK() // into the new log file
	acked++
	kill("a push after the flush")

	for _, c := range crashes {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, snapshotFile), c.snap, 0o640))
		require.NoError(t, os.WriteFile(filepath.Join(dir, logFile), c.log, 0o640))
		r := &fixture{t: t, dir: dir, cfg: cfg, w: &fakeWriter{}, now: f.now}
		r.open()
		r.requireCounted(c.acked, "crash at %q", c.name)
		r.close()
	}
	snapSeq, logSeqs := stateFiles(t, f.dir)
	require.Equal(t, []uint64{snapSeq + 1, snapSeq + 2, snapSeq + 3, snapSeq + 4}, logSeqs,
		"the log holds the 3 pushes made during the write and the one after, not those the snapshot holds")
	f.reopen()
	f.requireCounted(acked)

	require.Len(t, crashes, 8)
}

// A log reset during a flush's write (an fsync failed) writes a newer
// snapshot and empties the log: the flush's older snapshot is not installed
// over it, or the pushes acknowledged between the two would be lost.
func TestFlushDropsItsSnapshotAfterAResetDuringTheWrite(t *testing.T) {
	f := newFixture(t, testConfig())
	f.pushOK()
	f.gw.Flush(context.Background())
	f.pushOK()

	var fail atomic.Bool
	f.gw.flushStep = func(s flushStep) {
		if s != stepPrepared {
			return
		}
		fail.Store(true)
		f.injectSync(func() error {
			if fail.CompareAndSwap(true, false) {
				return errDisk
			}
			return nil
		})
		code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterText)
		require.Equal(t, http.StatusInternalServerError, code, body) // refused; the log is rewritten
		f.pushOK()                                                   // into the rewritten log
	}
	f.gw.Flush(context.Background())
	f.gw.flushStep = func(flushStep) {}
	require.Equal(t, 1.0, testutil.ToFloat64(f.gw.metrics.recoveries.WithLabelValues("success")))
	require.Equal(t, 0.0, testutil.ToFloat64(f.gw.metrics.compactions.WithLabelValues("failure")))

	snapSeq, logSeqs := stateFiles(t, f.dir)
	require.Equal(t, []uint64{snapSeq + 1}, logSeqs, "the reset's snapshot stays, and the log it emptied holds the last push")
	entries, err := os.ReadDir(f.dir)
	require.NoError(t, err)
	require.Len(t, entries, 2, "the flush's snapshot was discarded")
	f.reopen()
	f.requireCounted(3)
}

// Flushes that run while pushes do keep every acknowledged push, once,
// across a restart; and a flush with none running empties the log.
func TestFlushesDuringConcurrentPushesKeepEveryPush(t *testing.T) {
	cfg := testConfig()
	cfg.RateLimit = RateLimit{RequestsPerSecond: 1e6, Burst: 1e6}
	f := newFixture(t, cfg)
	const pushers, each = 4, 40
	var wg sync.WaitGroup
	var failed atomic.Int32
	stop := make(chan struct{})
	flushes := make(chan int, 1)
	go func() {
		n := 0
		defer func() { flushes <- n }()
		for {
			select {
			case <-stop:
				return
			default:
				f.gw.Flush(context.Background())
				n++
			}
		}
	}()
	for range pushers {
		wg.Go(func() {
			for range each {
				if code := <-f.pushAsync("tok-a"); code != http.StatusOK {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	t.Logf("%d flushes during the pushes", <-flushes)
	require.Zero(t, failed.Load())
	f.gw.Flush(context.Background())
	_, logSeqs := stateFiles(t, f.dir)
	require.Empty(t, logSeqs)
	f.reopen()
	f.requireCounted(pushers * each)
}
