package gcburst

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetrics(t *testing.T) {
	withGOGC(t, 70, 10)
	t.Cleanup(func() { watching.Store(false); busy.Store(false) })
	reg := prometheus.NewRegistry()
	RegisterMetrics(reg)
	base := map[string]uint64{"lowered": loweredBursts.Load(), "unchanged": unchangedBursts.Load(), "skipped_busy": skippedBusy.Load()}

	end := Begin()
	running := `
# HELP phonehome_gc_burst_running 1 while GOGC is lowered to --runtime.compaction-gogc for a block write.
# TYPE phonehome_gc_burst_running gauge
phonehome_gc_burst_running 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(running), "phonehome_gc_burst_running"); err != nil {
		t.Error(err)
	}
	end()
	debug.SetGCPercent(5) // --runtime.gogc=5: a burst leaves it
	Begin()()
	debug.SetGCPercent(70)
	watching.Store(true)
	busy.Store(true)
	BeginIfQuiet()()

	if got := loweredBursts.Load() - base["lowered"]; got != 1 {
		t.Errorf("lowered counted %d, want 1", got)
	}
	if got := unchangedBursts.Load() - base["unchanged"]; got != 1 {
		t.Errorf("unchanged counted %d, want 1", got)
	}
	if got := skippedBusy.Load() - base["skipped_busy"]; got != 1 {
		t.Errorf("skipped_busy counted %d, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "phonehome_gc_bursts_total"); err != nil || n != 3 {
		t.Errorf("phonehome_gc_bursts_total series = %d (%v), want 3 (lowered, unchanged, skipped_busy)", n, err)
	}
	stopped := strings.Replace(running, "phonehome_gc_burst_running 1\n", "phonehome_gc_burst_running 0\n", 1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(stopped), "phonehome_gc_burst_running"); err != nil {
		t.Error(err)
	}
}
