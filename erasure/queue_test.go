package erasure

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/storage/lifecycle"
)

// TestRefusedSubmitLeavesNothing: a job refused because the queue is full
// keeps no state (its file holds the raw id) and holds no tenant's
// shipping; a restart with more jobs on disk than the queue holds starts.
func TestRefusedSubmitLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, dir, Options{})
	require.NoError(t, err)
	for range maxQueuedJobs {
		_, err := e.Submit(Request{Tenant: "acme", ClusterID: "c"})
		require.NoError(t, err)
	}
	_, err = e.Submit(Request{Tenant: "other", ClusterID: secretID})
	require.ErrorIs(t, err, ErrQueueFull)
	require.False(t, e.ShippingHeld("other"), "a refused job holds its tenant's shipping")
	require.Empty(t, e.List("other"))
	h := auth.Middleware(auth.Insecure{Tenant: "other"}, 0, nil, e.Handler(nil))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/v1/admin/erase", strings.NewReader(`{"cluster_id":"x"}`)))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, "the API's answer: retry later")
	require.NotEmpty(t, rec.Header().Get("Retry-After"))
	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, files, maxQueuedJobs, "the refused job's state file is gone")

	done := make(chan error, 1)
	go func() {
		e2, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, dir, Options{})
		if err == nil {
			_, err = e2.Submit(Request{Tenant: "acme", ClusterID: "d"}) // and takes new jobs
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("New blocked on the jobs found on disk")
	}
}

// interruptedBucket stops when its context ends, as a bucket step does at
// shutdown.
type interruptedBucket struct{}

func (b *interruptedBucket) EraseBucket(ctx context.Context, _ string, _ []*labels.Matcher, _ []string, _ string, _ func(int, int)) (lifecycle.BucketErasure, error) {
	return lifecycle.BucketErasure{}, ctx.Err()
}

// TestShutdownIsNotAFailure: a job whose step ends because the receiver is
// stopping is resumed at the next start without counting as a failure
// (the failing-erasure alert would fire after every rollout).
func TestShutdownIsNotAFailure(t *testing.T) {
	dir := t.TempDir()
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &interruptedBucket{}, dir, Options{})
	require.NoError(t, err)
	st, err := e.Submit(Request{Tenant: "acme", ClusterID: "c"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stopping
	require.Error(t, e.Do(ctx, st.ID))
	got, ok := e.Get(st.ID)
	require.True(t, ok)
	require.Zero(t, got.Failures)
	require.Zero(t, testutil.ToFloat64(e.m.failing))
}
