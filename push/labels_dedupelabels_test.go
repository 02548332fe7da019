//go:build dedupelabels

package push

import (
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
)

// TestRestoredLabelsShareOneSymbolTable: decoding a series of the push log
// or snapshot interns its labels in the shared table, instead of making a
// ~50 KB table per series as labels.Labels' own decoder does.
func TestRestoredLabelsShareOneSymbolTable(t *testing.T) {
	raw := []byte(`{"labels":{"__name__":"cluster_installation_invocation","platform":"aws","version":"4.16.2"},"value":2,"set":true}`)
	var d delta
	require.NoError(t, json.Unmarshal(raw, &d)) // interns the strings once
	want := labels.FromStrings("__name__", "cluster_installation_invocation", "platform", "aws", "version", "4.16.2")
	require.True(t, labels.Equal(want, d.Labels), "got %s", d.Labels) // tables differ: not require.Equal
	require.Equal(t, 2.0, d.Value)
	require.True(t, d.Set)

	const n = 100
	perDecode := func(raw []byte, v any) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range n {
			require.NoError(t, json.Unmarshal(raw, v))
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / n
	}
	require.Less(t, perDecode(raw, &delta{}), uint64(4<<10), "bytes allocated per decoded delta")
	require.Less(t, perDecode(raw, &aggItem{}), uint64(4<<10), "bytes allocated per decoded aggItem")
	var ls labels.Labels
	require.Greater(t, perDecode([]byte(`{"platform":"aws","version":"4.16.2"}`), &ls), uint64(16<<10),
		"labels.Labels' own decoder makes a table per call: the reason for this test")
}

// TestRefusedPushesDoNotGrowTheTable: the labels of a refused push stay in
// the push's own table; the shared one holds only what the state keeps.
func TestRefusedPushesDoNotGrowTheTable(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = 1
	f := newFixture(t, cfg)
	push := func(run int) (int, string) {
		code, body, _ := f.push(http.MethodPost, "/metrics/job/i", "tok-a", "",
			fmt.Sprintf("# TYPE installs_total counter\ninstalls_total{run=%q} 1\n", fmt.Sprint(run)))
		return code, body
	}
	for range 2 { // pushed more than once and not idle: the series budget does not evict it
		code, body := push(0)
		require.Equal(t, http.StatusOK, code, body)
	}
	f.state("acme") // flushed: the refusals below are final (400), not "retry after the first flush"
	n := symbols.Len()
	for run := 1; run <= 50; run++ {
		code, body := push(run)
		require.Equal(t, http.StatusBadRequest, code, body) // the series limit
	}
	require.Equal(t, n, symbols.Len())
	code, body := push(0)
	require.Equal(t, http.StatusOK, code, body, "the kept series still adds up")
	require.Equal(t, n, symbols.Len())
}
