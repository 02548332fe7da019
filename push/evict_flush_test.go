package push

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// A flush builds the eviction order, outside the Gateway's mutex: the first
// push that needs room after it does not build one, and while the build
// runs pushes (evicting with the previous flush's order) and reads go on.
func TestFlushBuildsTheEvictOrderOutsideTheMutex(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = 3
	f := newFixture(t, cfg)
	push := func(n int) {
		t.Helper()
		code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "", counterPush(fmt.Sprintf(`junk="%d"`, n)))
		require.Equal(t, http.StatusOK, code, body)
	}
	order := func() *evictOrder {
		f.gw.mu.Lock()
		defer f.gw.mu.Unlock()
		st := f.gw.state["acme"]
		require.NotNil(t, st.evict, "no order built")
		require.Equal(t, st.flushedSeq, st.evict.flushedSeq, "the order is not the last flush's")
		return st.evict
	}
	for i := 1; i <= 3; i++ {
		push(i)
	}
	f.state("acme") // stored: evictable
	built := order()
	push(4) // the budget is full: junk 1 goes
	require.Same(t, built, order(), "the push built an order")
	require.NotContains(t, f.held("acme"), junk(1))

	// The next flush's build waits (flushPause: the test fails instead of
	// hanging if pushes waited for it too).
	p := newFlushPause(t)
	f.gw.buildEvictOrder = func(seq uint64, cands []evictCandidate) *evictOrder {
		p.hold()
		return buildEvictOrder(seq, cands)
	}
	p.start(f.gw, "the eviction order's build")
	push(5) // the last flush's order: junk 2 goes
	held := f.held("acme")
	p.resume()
	require.Equal(t, []string{junk(3), junk(4), junk(5)}, slices.Sorted(maps.Keys(held)))

	push(6) // the new order: junk 3 goes; junk 5 is not stored yet
	require.Equal(t, []string{junk(4), junk(5), junk(6)}, slices.Sorted(maps.Keys(f.held("acme"))))
	require.Equal(t, 3.0, testutil.ToFloat64(f.gw.metrics.evicted.WithLabelValues("acme")))
}

// Orders built by flushes while pushes run evict exactly what a full scan
// of the tenant's series would, at any moment.
func TestEvictOrderBuiltDuringPushesMatchesTheFullScan(t *testing.T) {
	ctx := context.Background()
	var compared, refused atomic.Int64
	for seed := range 3 {
		now := time.Unix(1_800_000_000, 0)
		g := openEvictTestGateway(t, &now)
		for round := range 40 {
			var wg sync.WaitGroup
			wg.Go(func() {
				for range 2 {
					g.Flush(ctx)
				}
			})
			for w := range 2 {
				rnd := rand.New(rand.NewPCG(uint64(seed), uint64(round*2+w)))
				series := seriesMaker() // a table per pusher, as a push has its own
				wg.Go(func() {
					for range 8 {
						rec := randomEvictRecord(rnd, series)
						needed, full, err := evictionsMatchFullScan(g, rec, now)
						if err != nil {
							t.Errorf("seed %d round %d: %v", seed, round, err)
						}
						if needed {
							compared.Add(1)
						}
						if full {
							refused.Add(1)
						}
						_ = g.accept(rec) // refusals are part of the game
					}
				})
			}
			wg.Wait()
			now = now.Add(time.Duration(g.cfg.EvictIdleAfter) / 3) // idle series become evictable
		}
		require.NoError(t, g.Close())
	}
	t.Logf("%d evictions compared, %d refusals", compared.Load(), refused.Load())
	require.Greater(t, compared.Load()-refused.Load(), int64(150))
}
