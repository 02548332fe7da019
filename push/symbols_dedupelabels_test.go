//go:build dedupelabels

package push

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
)

// TestDroppedSeriesDoNotGrowTheTable: the strings of series the state no
// longer holds (evicted here; expired and erased alike) leave the shared
// table, or a token holder pushing junk label values once per flush grows
// the receiver's memory without bound, however small the series budget.
func TestDroppedSeriesDoNotGrowTheTable(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = 1
	f := newFixture(t, cfg)
	push := func(run int) {
		t.Helper()
		code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "",
			fmt.Sprintf("# TYPE installs_total counter\ninstalls_total{run=\"junk-%d\"} 1\n", run))
		require.Equal(t, http.StatusOK, code, body)
		f.now = f.now.Add(time.Second) // within the rate limit
		f.state("acme")                // flushed: evictable by the next push
	}
	push(0)
	n := symbols.Len()
	const runs = 500
	for run := 1; run <= runs; run++ {
		push(run) // evicts the previous one, pushed once
	}
	require.Equal(t, 1, f.gw.seriesCount(), "the budget holds one series")
	require.Less(t, symbols.Len()-n, runs/4, "strings of evicted series kept in the symbol table")
}

// TestErasedClusterLeavesTheTable: an erasure drops the cluster's _id from
// memory too, not only from the state and its snapshot.
func TestErasedClusterLeavesTheTable(t *testing.T) {
	f := newFixture(t, testConfig())
	code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-c1", "", "# TYPE installs_total counter\ninstalls_total{run=\"erased-run\"} 1\n")
	require.Equal(t, http.StatusOK, code, body)
	n := symbols.Len()
	_, err := f.gw.Erase("acme", []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", "c1")})
	require.NoError(t, err)
	require.Equal(t, 0, f.gw.seriesCount())
	require.Less(t, symbols.Len(), n, "the erased series' strings are still interned")
}
