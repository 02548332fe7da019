package storage_test

import (
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/storage"
)

func TestReplacesPrefersTheRewriteOverULIDOrder(t *testing.T) {
	at := func(d time.Duration) ulid.ULID {
		return ulid.MustNew(ulid.Timestamp(time.Now().Add(d)), ulid.DefaultEntropy())
	}
	src := at(time.Hour) // written by a replica whose clock runs ahead
	block := tsdb.BlockMeta{ULID: src, Compaction: tsdb.BlockMetaCompaction{Sources: []ulid.ULID{src}}}
	rewrite := tsdb.BlockMeta{ULID: at(0), Compaction: tsdb.BlockMetaCompaction{
		Sources: []ulid.ULID{src}, Parents: []tsdb.BlockDesc{{ULID: src}},
	}}
	require.True(t, storage.Replaces(rewrite, block))
	require.False(t, storage.Replaces(block, rewrite))

	twin := tsdb.BlockMeta{ULID: at(time.Minute), Compaction: tsdb.BlockMetaCompaction{Sources: []ulid.ULID{src}}}
	require.True(t, storage.Replaces(twin, rewrite), "no parent link: the newer ULID")
	merged := tsdb.BlockMeta{ULID: at(-time.Hour), Compaction: tsdb.BlockMetaCompaction{Sources: []ulid.ULID{src, at(0)}}}
	require.True(t, storage.Replaces(merged, block), "more sources")
	require.False(t, storage.Replaces(block, merged))
}
