package storage_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"

	"github.com/phonehome/phonehome/storage"
)

// Close names the blocks a failed upload left on local disk, and none
// after a clean one.
func TestCloseNamesBlocksNotUploaded(t *testing.T) {
	dir := t.TempDir()
	bkt := &recordingBucket{Bucket: objstore.NewInMemBucket()}
	bkt.failing.Store(true)
	db, err := storage.OpenWithBucket(discard, nil, dir, testConfig(), bkt, time.Now)
	require.NoError(t, err)
	require.Nil(t, db.NotUploaded(), "before Close")
	writeFixture(t, db)
	require.ErrorIs(t, db.Close(), errInjected)
	var want []string
	for _, tenant := range []string{"alpha", "beta"} {
		for _, id := range localBlocks(t, dir, tenant) {
			want = append(want, tenant+"/"+id)
		}
	}
	require.NotEmpty(t, want)
	require.ElementsMatch(t, want, db.NotUploaded())

	bkt.failing.Store(false)
	db, err = storage.OpenWithBucket(discard, nil, dir, testConfig(), bkt, time.Now)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.Empty(t, db.NotUploaded())
}
