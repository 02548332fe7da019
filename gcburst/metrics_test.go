package gcburst

import (
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
	base := map[string]uint64{"lowered": lowered.Load(), "skipped_busy": skippedBusy.Load()}

	end := Begin()
	running := `
# HELP phonehome_gc_burst_running 1 while a block write runs at the lowered GOGC of --runtime.compaction-gogc.
# TYPE phonehome_gc_burst_running gauge
phonehome_gc_burst_running 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(running), "phonehome_gc_burst_running"); err != nil {
		t.Error(err)
	}
	end()
	watching.Store(true)
	busy.Store(true)
	BeginIfQuiet()()

	if got := lowered.Load() - base["lowered"]; got != 1 {
		t.Errorf("lowered counted %d, want 1", got)
	}
	if got := skippedBusy.Load() - base["skipped_busy"]; got != 1 {
		t.Errorf("skipped_busy counted %d, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "phonehome_gc_bursts_total"); err != nil || n != 2 {
		t.Errorf("phonehome_gc_bursts_total series = %d (%v), want 2 (lowered, skipped_busy)", n, err)
	}
	stopped := strings.Replace(running, "phonehome_gc_burst_running 1\n", "phonehome_gc_burst_running 0\n", 1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(stopped), "phonehome_gc_burst_running"); err != nil {
		t.Error(err)
	}
}
