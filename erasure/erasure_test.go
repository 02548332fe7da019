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

// Resumed closes once the jobs found at start have been attempted, failed
// ones included; at once when there are none.
func TestResumedAfterTheJobsFoundAtStart(t *testing.T) {
	dir := t.TempDir()
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, dir, Options{})
	require.NoError(t, err)
	select {
	case <-e.Resumed():
	default:
		t.Fatal("nothing to resume, yet Resumed is open")
	}
	_, err = e.Submit(Request{Tenant: "acme", ClusterID: "c1"})
	require.NoError(t, err)
	_, err = e.Submit(Request{Tenant: "acme", ClusterID: "c2"})
	require.NoError(t, err)

	local := &fakeLocal{fail: errors.New("disk on fire")}
	e, err = New(slog.New(slog.DiscardHandler), nil, local, &fakeBucket{}, dir, Options{})
	require.NoError(t, err)
	select {
	case <-e.Resumed():
		t.Fatal("Resumed closed before the jobs ran")
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.Run(ctx) }()
	select {
	case <-e.Resumed(): // both attempted, both failed
	case <-time.After(10 * time.Second):
		t.Fatal("Resumed not closed after the jobs were attempted")
	}
	cancel()
	require.NoError(t, <-done)
}

func TestHandlerScopesToTheCallersTenant(t *testing.T) {
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, filepath.Join(t.TempDir(), "jobs"), Options{})
	require.NoError(t, err)
	h := auth.Middleware(auth.Insecure{Tenant: "acme"}, 0, nil, e.Handler())
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
