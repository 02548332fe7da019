package storage

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
)

// HoldShipping: no round uploads before release closes, the shutdown's
// neither; then the next round does.
func TestHoldShippingUploadsNothingUntilReleased(t *testing.T) {
	for _, release := range []bool{true, false} {
		var cfg Config
		cfg.SetDefaults()
		bkt := objstore.NewInMemBucket()
		db, err := openWithBucket(slog.New(slog.DiscardHandler), nil, t.TempDir(), cfg, bkt, time.Now)
		require.NoError(t, err)
		hold := make(chan struct{})
		db.HoldShipping(hold)
		_, err = db.Write(context.Background(), "t", []prompb.TimeSeries{{
			Labels:  []prompb.Label{{Name: "__name__", Value: "m"}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: time.Now().UnixMilli()}},
		}})
		require.NoError(t, err)
		require.NoError(t, db.Flush())
		require.NoError(t, db.ship(context.Background()))
		require.Empty(t, bkt.Objects(), "held: nothing uploaded")
		if release {
			close(hold)
			require.NoError(t, db.ship(context.Background()))
			require.NotEmpty(t, bkt.Objects(), "released: the block is uploaded")
		}
		require.NoError(t, db.Close())
		if !release {
			require.Empty(t, bkt.Objects(), "the shutdown's round is held too")
		}
	}
}
