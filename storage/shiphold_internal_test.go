package storage

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
)

// HoldShipping: no round uploads a held tenant's blocks, the shutdown's
// neither, while the other tenants' go; they count as pending and in the
// bucket lag. Once the hold ends, the next round uploads them.
func TestHoldShippingHoldsTheTenantOnly(t *testing.T) {
	for _, release := range []bool{true, false} {
		var cfg Config
		cfg.SetDefaults()
		bkt := objstore.NewInMemBucket()
		db, err := openWithBucket(slog.New(slog.DiscardHandler), nil, t.TempDir(), cfg, bkt, time.Now)
		require.NoError(t, err)
		var held atomic.Bool
		held.Store(true)
		db.HoldShipping(func(tenant string) bool { return tenant == "erasing" && held.Load() })
		for _, tenant := range []string{"erasing", "other"} {
			_, err = db.Write(context.Background(), tenant, []prompb.TimeSeries{{
				Labels:  []prompb.Label{{Name: "__name__", Value: "m"}},
				Samples: []prompb.Sample{{Value: 1, Timestamp: time.Now().Add(-3 * time.Hour).UnixMilli()}},
			}})
			require.NoError(t, err)
		}
		require.NoError(t, db.Flush())
		require.NoError(t, db.ship(context.Background()))
		require.Equal(t, []string{"other"}, tenantsIn(t, bkt), "held: only the other tenant's block is uploaded")
		require.Equal(t, 1.0, testutil.ToFloat64(db.m.heldBlocks))
		require.Equal(t, 1.0, testutil.ToFloat64(db.m.pendingBlocks))
		require.Greater(t, testutil.ToFloat64(db.m.bucketLag), 3600.0)
		if release {
			held.Store(false)
			require.NoError(t, db.ship(context.Background()))
			require.Equal(t, []string{"erasing", "other"}, tenantsIn(t, bkt), "released: the block is uploaded")
			require.Zero(t, testutil.ToFloat64(db.m.heldBlocks))
			require.Zero(t, testutil.ToFloat64(db.m.bucketLag))
		}
		require.NoError(t, db.Close())
		if !release {
			require.Equal(t, []string{"other"}, tenantsIn(t, bkt), "the shutdown's round holds it too")
		}
	}
}

// tenantsIn lists the tenants of the blocks in bkt, sorted.
func tenantsIn(t *testing.T, bkt *objstore.InMemBucket) []string {
	t.Helper()
	set := map[string]bool{}
	for name, b := range bkt.Objects() {
		if strings.HasSuffix(name, "/meta.json") {
			var m ThanosMeta
			require.NoError(t, json.Unmarshal(b, &m))
			set[m.Thanos.Labels[tenantLabel]] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}
