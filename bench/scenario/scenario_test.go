package scenario

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/bench/fleet"
)

func TestMeasureBlocks(t *testing.T) {
	dir := t.TempDir()
	write := func(p string, n int) {
		t.Helper()
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, make([]byte, n), 0o644))
	}
	for _, b := range []string{"tenant/01A", "01B"} {
		write(filepath.Join(dir, b, "index"), 100)
		write(filepath.Join(dir, b, "chunks", "000001"), 300)
		require.NoError(t, os.WriteFile(filepath.Join(dir, b, "meta.json"),
			[]byte(`{"minTime":10,"maxTime":20,"stats":{"numSamples":50,"numSeries":10,"numChunks":10}}`), 0o644))
	}
	write(filepath.Join(dir, "not-a-block", "index"), 1000)

	b, err := measureBlocks(dir)
	require.NoError(t, err)
	metaLen := int64(len(`{"minTime":10,"maxTime":20,"stats":{"numSamples":50,"numSeries":10,"numChunks":10}}`))
	require.Equal(t, 2, b.Count)
	require.Equal(t, int64(200), b.IndexBytes)
	require.Equal(t, int64(600), b.ChunkBytes)
	require.Equal(t, 800+2*metaLen, b.Bytes)
	require.Equal(t, int64(100), b.NumSamples)
	require.InDelta(t, 6.0, b.ChunkBytesPerSample, 1e-9)
	require.InDelta(t, 10.0, b.IndexBytesPerSeries, 1e-9)
}

func TestReadProcSelf(t *testing.T) {
	m, err := readProcMem(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, m.rss)
	require.GreaterOrEqual(t, m.hwm, m.rss)
	_, err = cpuSeconds(os.Getpid())
	require.NoError(t, err)
}

func TestFiguresAreMediansAndREADMEKeepsHandWrittenText(t *testing.T) {
	r := &Report{Scenario: "steady", Size: "x", Repeat: 3}
	for i, v := range []float64{100, 300, 200} {
		r.Results = append(r.Results,
			&TargetResult{Name: "receiver", Repeat: i, Load: &fleet.Result{AcceptedPerSec: v}},
			&TargetResult{Name: "prometheus", Repeat: i, Load: &fleet.Result{AcceptedPerSec: 100}})
	}
	r.Results = append(r.Results, &TargetResult{Name: "receiver", Error: "boom", Load: &fleet.Result{AcceptedPerSec: 1e9}})
	r.computeRatios()
	require.Equal(t, 200.0, r.Figures[0].Receiver)
	require.Equal(t, 2.0, r.Figures[0].Ratio)
	require.False(t, math.IsNaN(r.Figures[0].Prometheus))

	path := filepath.Join(t.TempDir(), "README.md")
	require.NoError(t, os.WriteFile(path, []byte("# Title\n\nnotes\n\n"+beginMark+"\nold\n"+endMark+"\n\ntrailer\n"), 0o644))
	require.NoError(t, UpdateREADME(path, []*Report{r}))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	s := string(got)
	require.True(t, strings.HasPrefix(s, "# Title\n\nnotes\n\n"+beginMark))
	require.True(t, strings.HasSuffix(s, endMark+"\n\ntrailer\n"))
	require.NotContains(t, s, "old")
	require.Contains(t, s, "| accepted samples/s (all rounds) [samples/s] (higher is better) | 200.0 | 100.0 | 2.00× |")
}

func TestTimelineBucketsThroughputAndLatency(t *testing.T) {
	var evs []fleet.Event
	for i := range 100 { // 100 requests of 500 samples over 10s, 10ms each
		evs = append(evs, fleet.Event{Start: time.Duration(i) * 100 * time.Millisecond, Latency: 10 * time.Millisecond, Accepted: 500})
	}
	tl := timeline(evs, 5)
	require.NotEmpty(t, tl)
	var total float64
	for i, p := range tl {
		w := 1.0 // 10s/80 is under the 1s minimum window
		total += p.SamplesPerSec * w
		require.InDelta(t, 5+float64(i+1)*w, p.T, 1e-9)
		if p.P99ms > 0 {
			require.InDelta(t, 10, p.P99ms, 1e-9)
		}
	}
	require.InDelta(t, 50000, total, 1e-6)
}
