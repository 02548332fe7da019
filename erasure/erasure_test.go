package erasure

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const secretID = "raw-cluster-id-9a8b7c"

type fakeLocal struct {
	erased, denied []string
	fail           error
}

func (f *fakeLocal) EraseLocal(_ context.Context, tenant string, ms []*labels.Matcher, forbidden []string) (storage.LocalErasure, error) {
	if f.fail != nil {
		return storage.LocalErasure{}, f.fail
	}
	f.erased = append(f.erased, tenant+" "+ms[0].String()+" "+strings.Join(forbidden, ","))
	return storage.LocalErasure{Series: 2}, nil
}

func (f *fakeLocal) Deny(tenant, id, _ string) error {
	f.denied = append(f.denied, tenant+" "+id)
	return nil
}

func (f *fakeLocal) Readmit(string, string) (bool, error) { return true, nil }

type fakeBucket struct{ calls int }

func (f *fakeBucket) EraseBucket(_ context.Context, _ string, _ []*labels.Matcher, _ []string, _ string, progress func(int, int)) (lifecycle.BucketErasure, error) {
	f.calls++
	progress(0, 2)
	progress(2, 2)
	return lifecycle.BucketErasure{Blocks: 2, Rewritten: 1, Series: 1}, nil
}

func TestRequestValidation(t *testing.T) {
	for _, req := range []Request{
		{ClusterID: "x"},
		{Tenant: "acme"},
		{Tenant: "acme", ClusterID: "x", Selector: "{a=\"b\"}"},
		{Tenant: "acme", Selector: "{job=~\".*\"}"},
		{Tenant: "acme", Selector: "up{"},
	} {
		_, _, err := req.matchers()
		require.ErrorIs(t, err, ErrInvalid, "%+v", req)
	}
	ms, forbidden, err := Request{Tenant: "acme", Selector: `{_id="abc",job="x"}`}.matchers()
	require.NoError(t, err)
	require.Len(t, ms, 2)
	require.Equal(t, []string{"abc"}, forbidden)
}

func TestJobResumesAfterACrashAndForgetsTheID(t *testing.T) {
	dir := t.TempDir()
	local := &fakeLocal{fail: errors.New("disk on fire")}
	e, err := New(slog.New(slog.DiscardHandler), nil, local, &fakeBucket{}, dir, Options{})
	require.NoError(t, err)
	st, err := e.Submit(Request{Tenant: "acme", ClusterID: secretID})
	require.NoError(t, err)
	require.Equal(t, storage.ClusterDigest("acme", secretID), st.ClusterSHA256)
	require.Error(t, e.Do(context.Background(), st.ID))
	got, _ := e.Get(st.ID)
	require.Equal(t, StateFailed, got.State)
	require.Equal(t, 1.0, testutil.ToFloat64(e.m.jobs.WithLabelValues("failure")))

	// A new process finds the job on disk and finishes it. The process
	// died while it rewrote the state: the torn temporary copy, which holds
	// the id too, is removed at start.
	torn := filepath.Join(dir, "."+st.ID+".json.123.tmp")
	require.NoError(t, os.WriteFile(torn, []byte(`{"request":{"cluster_id":"`+secretID), 0o600))
	local.fail = nil
	bkt := &fakeBucket{}
	var buf bytes.Buffer
	e, err = New(slog.New(slog.NewJSONHandler(&buf, nil)), nil, local, bkt, dir, Options{})
	require.NoError(t, err)
	require.NoError(t, e.Do(context.Background(), <-e.queue))
	got, _ = e.Get(st.ID)
	require.Equal(t, StateDone, got.State)
	require.Equal(t, 2, got.BlocksDone)
	require.Equal(t, 3, got.SeriesRemoved)
	require.Equal(t, 1, bkt.calls)
	require.Equal(t, []string{"acme " + secretID, "acme " + secretID}, local.denied)
	require.Equal(t, []string{`acme _id="` + secretID + `" ` + secretID}, local.erased)
	// Nothing of the id is left: the state file is gone, the log and the
	// status carry the digest only.
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries)
	require.NotContains(t, buf.String(), secretID)
	require.Contains(t, buf.String(), `"msg":"erasure done"`)
	require.Contains(t, buf.String(), got.ClusterSHA256)
}

// fakePushes records its erasures, and the order of steps in log.
type fakePushes struct{ log *[]string }

func (f fakePushes) Erase(tenant string, ms []*labels.Matcher) (int, error) {
	*f.log = append(*f.log, "push "+tenant+" "+ms[0].String())
	return 4, nil
}

type orderedLocal struct {
	fakeLocal
	log *[]string
}

func (o *orderedLocal) EraseLocal(ctx context.Context, tenant string, ms []*labels.Matcher, forbidden []string) (storage.LocalErasure, error) {
	*o.log = append(*o.log, "local")
	return o.fakeLocal.EraseLocal(ctx, tenant, ms, forbidden)
}

// The installer pushes' state is erased before the local storage: a flush
// in between would write the cluster's series back into the head.
func TestJobErasesThePushStateFirst(t *testing.T) {
	var steps []string
	e, err := New(slog.New(slog.DiscardHandler), nil, &orderedLocal{log: &steps}, &fakeBucket{}, t.TempDir(), Options{Pushes: fakePushes{&steps}})
	require.NoError(t, err)
	st, err := e.Submit(Request{Tenant: "acme", ClusterID: "c1"})
	require.NoError(t, err)
	require.NoError(t, e.Do(context.Background(), st.ID))
	require.Equal(t, []string{`push acme _id="c1"`, "local"}, steps)
	got, _ := e.Get(st.ID)
	require.Equal(t, 4+2+1, got.SeriesRemoved, "push, local and bucket series")
}

// flaky fails its first n calls, and records held() at each call.
type flaky struct {
	n, calls int
	held     func() bool
	heldSeen []bool
}

func (f *flaky) call() error {
	f.calls++
	f.heldSeen = append(f.heldSeen, f.held())
	if f.calls <= f.n {
		return errors.New("disk on fire")
	}
	return nil
}

type flakyLocal struct {
	fakeLocal
	flaky
}

func (f *flakyLocal) EraseLocal(ctx context.Context, tenant string, ms []*labels.Matcher, forbidden []string) (storage.LocalErasure, error) {
	if err := f.call(); err != nil {
		return storage.LocalErasure{}, err
	}
	return f.fakeLocal.EraseLocal(ctx, tenant, ms, forbidden)
}

type flakyBucket struct {
	fakeBucket
	flaky
}

func (f *flakyBucket) EraseBucket(ctx context.Context, tenant string, ms []*labels.Matcher, forbidden []string, work string, progress func(int, int)) (lifecycle.BucketErasure, error) {
	if err := f.call(); err != nil {
		return lifecycle.BucketErasure{}, err
	}
	return f.fakeBucket.EraseBucket(ctx, tenant, ms, forbidden, work, progress)
}

// runUntilDone runs e until job id is done, and stops it.
func runUntilDone(t *testing.T, e *Eraser, id string) Status {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.Run(ctx) }()
	require.Eventually(t, func() bool {
		st, _ := e.Get(id)
		return st.State == StateDone
	}, 10*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	st, _ := e.Get(id)
	return st
}

// A job whose local step fails holds its tenant's shipping, and only its
// tenant's, through every failure; Run retries it with a backoff, logging
// and counting every failure, until it succeeds and the hold ends.
func TestFailingLocalStepHoldsShippingUntilARetrySucceeds(t *testing.T) {
	var logs bytes.Buffer
	local := &flakyLocal{flaky: flaky{n: 2}}
	e, err := New(slog.New(slog.NewJSONHandler(&logs, nil)), nil, local, &fakeBucket{}, t.TempDir(), Options{RetryMin: time.Millisecond, RetryMax: 4 * time.Millisecond})
	require.NoError(t, err)
	local.held = func() bool { return e.ShippingHeld("acme") }
	st, err := e.Submit(Request{Tenant: "acme", ClusterID: "c1"})
	require.NoError(t, err)
	require.True(t, e.ShippingHeld("acme"), "pending: the local step has not run")
	require.False(t, e.ShippingHeld("other"))
	require.Equal(t, 1.0, testutil.ToFloat64(e.m.holding))
	require.Error(t, e.Do(context.Background(), st.ID))
	require.True(t, e.ShippingHeld("acme"), "failed: still held")
	require.Equal(t, 1.0, testutil.ToFloat64(e.m.failing))

	got := runUntilDone(t, e, st.ID)
	require.Equal(t, []bool{true, true, true}, local.heldSeen, "held at every attempt, after each failure too")
	require.False(t, e.ShippingHeld("acme"))
	require.Equal(t, 2, got.Failures)
	require.True(t, got.LocalDone)
	require.Zero(t, got.NextAttempt)
	require.Equal(t, 2.0, testutil.ToFloat64(e.m.jobs.WithLabelValues("failure")))
	require.Equal(t, 1.0, testutil.ToFloat64(e.m.jobs.WithLabelValues("success")))
	for _, g := range []prometheus.Gauge{e.m.unfinished, e.m.failing, e.m.holding} {
		require.Zero(t, testutil.ToFloat64(g))
	}
	require.Equal(t, 1, strings.Count(logs.String(), `"msg":"erasure failed; retrying"`), "Run's failure; the first was Do's")
	require.Contains(t, logs.String(), `"shipping_held":true`)
	require.NotContains(t, logs.String(), "c1\"")
}

// A job whose bucket step fails has erased the local storage: it does not
// hold shipping (the local blocks are clean; a bucket step stuck on one
// block must not keep every new block on the disk), and its retries run
// the bucket step only.
func TestFailingBucketStepRetriesWithoutTheLocalStep(t *testing.T) {
	local := &fakeLocal{}
	bucket := &flakyBucket{flaky: flaky{n: 2}}
	e, err := New(slog.New(slog.DiscardHandler), nil, local, bucket, t.TempDir(), Options{RetryMin: time.Millisecond, RetryMax: 4 * time.Millisecond})
	require.NoError(t, err)
	bucket.held = func() bool { return e.ShippingHeld("acme") }
	st, err := e.Submit(Request{Tenant: "acme", ClusterID: "c1"})
	require.NoError(t, err)
	got := runUntilDone(t, e, st.ID)
	require.Equal(t, []bool{false, false, false}, bucket.heldSeen)
	require.Len(t, local.erased, 1, "the local step ran once")
	require.Equal(t, 2+1, got.SeriesRemoved, "the first attempt's local series are kept")
	require.Equal(t, 2, got.Failures)
}

// After a restart, a job found on disk holds its tenant's shipping until
// its local step is done, and not after.
func TestShippingHeldAfterARestartUntilTheLocalStepIsDone(t *testing.T) {
	dir := t.TempDir()
	local := &flakyLocal{flaky: flaky{n: 1, held: func() bool { return true }}}
	bucket := &flakyBucket{flaky: flaky{n: 1, held: func() bool { return true }}}
	e, err := New(slog.New(slog.DiscardHandler), nil, local, bucket, dir, Options{})
	require.NoError(t, err)
	acme, err := e.Submit(Request{Tenant: "acme", ClusterID: "c1"})
	require.NoError(t, err)
	require.Error(t, e.Do(context.Background(), acme.ID), "fails in the local step")
	other, err := e.Submit(Request{Tenant: "other", ClusterID: "c2"})
	require.NoError(t, err)
	require.Error(t, e.Do(context.Background(), other.ID), "fails in the bucket step")

	e, err = New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, dir, Options{})
	require.NoError(t, err)
	require.True(t, e.ShippingHeld("acme"))
	require.False(t, e.ShippingHeld("other"))
	require.Equal(t, 2.0, testutil.ToFloat64(e.m.unfinished))
	require.Equal(t, 2.0, testutil.ToFloat64(e.m.failing))
	require.Equal(t, 1.0, testutil.ToFloat64(e.m.holding))
	runUntilDone(t, e, acme.ID)
	runUntilDone(t, e, other.ID)
	require.False(t, e.ShippingHeld("acme"))
}

func TestHandlerScopesToTheCallersTenant(t *testing.T) {
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, filepath.Join(t.TempDir(), "jobs"), Options{})
	require.NoError(t, err)
	h := auth.Middleware(auth.Insecure{Tenant: "acme"}, 0, nil, e.Handler(nil))
	post := func(body string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/v1/admin/erase", strings.NewReader(body)))
		return rec.Code
	}
	require.Equal(t, http.StatusForbidden, post(`{"tenant":"other","cluster_id":"x"}`))
	require.Equal(t, http.StatusBadRequest, post(`{"cluster_id":"x","unknown":1}`))
	require.Equal(t, http.StatusBadRequest, post(`{}`))
	require.Equal(t, http.StatusAccepted, post(`{"cluster_id":"x"}`))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/admin/erase", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Body.String(), `"state":"pending"`)
	require.NotContains(t, rec.Body.String(), `"x"`)
}

func TestSelectorIsRedacted(t *testing.T) {
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, t.TempDir(), Options{})
	require.NoError(t, err)
	st, err := e.Submit(Request{Tenant: "acme", Selector: `{_id="` + secretID + `", job="x"}`})
	require.NoError(t, err)
	require.NotContains(t, st.Selector, secretID)
	require.Contains(t, st.Selector, storage.ClusterDigest("acme", secretID))
	require.Contains(t, st.Selector, `job="x"`)
	require.NoError(t, e.Do(context.Background(), st.ID))
}

// The deny is applied when a job runs: a re-admission taken while the job
// waits must not be undone by it, also after a restart. The job still
// erases.
func TestReadmitWhileTheJobWaitsIsKept(t *testing.T) {
	dir := t.TempDir()
	local := &fakeLocal{}
	e, err := New(slog.New(slog.DiscardHandler), nil, local, &fakeBucket{}, dir, Options{})
	require.NoError(t, err)
	st, err := e.Submit(Request{Tenant: "acme", ClusterID: secretID})
	require.NoError(t, err)
	readmitted, err := e.Readmit("acme", secretID, "ticket-2", "test")
	require.NoError(t, err)
	require.True(t, readmitted)

	e, err = New(slog.New(slog.DiscardHandler), nil, local, &fakeBucket{}, dir, Options{}) // restarted before the job ran
	require.NoError(t, err)
	require.NoError(t, e.Do(context.Background(), <-e.queue))
	got, _ := e.Get(st.ID)
	require.Equal(t, StateDone, got.State)
	require.Empty(t, local.denied, "re-admitted before the job ran")
	require.Len(t, local.erased, 1)
}

// A re-admission whose job state cannot be saved fails, and leaves the job
// as its state file says (deny on): memory and disk agree, so the retried
// re-admission saves it, rather than finding nothing to change in memory
// while the file would deny the cluster again after a restart.
func TestReadmitSaveFailureIsRetried(t *testing.T) {
	dir := t.TempDir()
	local := &fakeLocal{}
	e, err := New(slog.New(slog.DiscardHandler), nil, local, &fakeBucket{}, dir, Options{})
	require.NoError(t, err)
	st, err := e.Submit(Request{Tenant: "acme", ClusterID: secretID})
	require.NoError(t, err)
	path := e.stateFile(st.ID)
	saved, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.MkdirAll(filepath.Join(path, "x"), 0o700)) // a rename onto it fails, also for root
	_, err = e.Readmit("acme", secretID, "ticket-2", "test")
	require.Error(t, err)

	require.NoError(t, os.RemoveAll(path))
	require.NoError(t, os.WriteFile(path, saved, 0o600)) // the disk as before: deny on
	readmitted, err := e.Readmit("acme", secretID, "ticket-2", "test")
	require.NoError(t, err)
	require.True(t, readmitted)

	e, err = New(slog.New(slog.DiscardHandler), nil, local, &fakeBucket{}, dir, Options{}) // restarted before the job ran
	require.NoError(t, err)
	require.NoError(t, e.Do(context.Background(), <-e.queue))
	require.Empty(t, local.denied, "the retried re-admission was saved")
}
