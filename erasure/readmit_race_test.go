package erasure

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/lifecycle"
)

// quietLocal is a Local that erases and denies nothing, safe for
// concurrent use.
type quietLocal struct{}

func (quietLocal) EraseLocal(context.Context, string, []*labels.Matcher, []string) (storage.LocalErasure, error) {
	return storage.LocalErasure{}, nil
}
func (quietLocal) Deny(string, string, string) error    { return nil }
func (quietLocal) Readmit(string, string) (bool, error) { return false, nil }

// signallingBucket tells when a job reaches its bucket step, and lets it
// go on at once.
type signallingBucket struct{ reached chan struct{} }

func (b signallingBucket) EraseBucket(context.Context, string, []*labels.Matcher, []string, string, func(int, int)) (lifecycle.BucketErasure, error) {
	b.reached <- struct{}{}
	return lifecycle.BucketErasure{}, nil
}

// TestReadmitWhileTheJobRuns: a re-admission turns off the deny of a job
// that runs at the same time (as it starts, or as it ends), which the job
// reads; the job still ends, and its state file (with the raw cluster id)
// does not come back after the job removed it.
func TestReadmitWhileTheJobRuns(t *testing.T) {
	dir := t.TempDir()
	bucket := signallingBucket{reached: make(chan struct{}, 1)}
	e, err := New(slog.New(slog.DiscardHandler), nil, quietLocal{}, bucket, dir, Options{})
	require.NoError(t, err)
	for i := range 200 {
		st, err := e.Submit(Request{Tenant: "acme", ClusterID: secretID})
		require.NoError(t, err)
		id := <-e.queue
		var wg sync.WaitGroup
		wg.Go(func() { require.NoError(t, e.Do(context.Background(), id)) })
		if i%2 == 0 { // as the job starts
			wg.Go(func() {
				_, err := e.Readmit("acme", secretID, "ticket", "test")
				require.NoError(t, err)
			})
			<-bucket.reached
		} else { // as it ends
			<-bucket.reached
			_, err = e.Readmit("acme", secretID, "ticket", "test")
			require.NoError(t, err)
		}
		wg.Wait()
		got, _ := e.Get(st.ID)
		require.Equal(t, StateDone, got.State)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, de := range entries {
			require.True(t, de.IsDir(), "the state file of a finished job, with the raw cluster id, is back: %s", de.Name())
		}
	}
}
