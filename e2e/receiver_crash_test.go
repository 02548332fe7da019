package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestReceiverCrashLosesNothingAcked runs a sustained write load from
// several goroutines, SIGKILLs the receiver in the middle of it, restarts it
// on the same storage path, and repeats. After every restart each sample
// that got a 2xx is queryable with its exact timestamp and value, and
// nothing is stored that was never sent.
func TestReceiverCrashLosesNothingAcked(t *testing.T) {
	const (
		writers   = 4
		perWriter = 5      // series per writer, one sample each per request
		stepMs    = 100    // timestamp step between a writer's requests
		maxReqs   = 20_000 // bound per writer; 2000 s of timestamps
		crashes   = 3
	)
	dir := t.TempDir()
	cfg := writeReceiverConfig(t, dir, "", "")
	data := filepath.Join(dir, "data")
	base := time.Now().Add(-30 * time.Minute).UnixMilli()
	sampleValue := func(k, s int) float64 { return float64(k)*10 + float64(s) + 0.5 }

	// Per writer: next request number and the requests acknowledged. Only
	// the writer's goroutine touches its state while a round runs.
	type writerState struct {
		next  int
		acked []int
	}
	state := make([]writerState, writers)
	var ackedTotal atomic.Int64

	verify := func(url string) {
		t.Helper()
		stored := map[[2]int]map[int64]string{} // (writer, series) -> ts -> value
		end := time.UnixMilli(base + maxReqs*stepMs + 1000)
		r := instant(t, url, tokenAcme, `crash_test[1h]`, end)
		for _, s := range r.Result {
			w, err := strconv.Atoi(s.Metric["writer"])
			require.NoError(t, err)
			sr, err := strconv.Atoi(s.Metric["series"])
			require.NoError(t, err)
			m := map[int64]string{}
			for _, v := range s.Values {
				m[parseAPITime(t, v[0])] = v[1].String()
			}
			stored[[2]int{w, sr}] = m
		}
		for w := range writers {
			for s := range perWriter {
				m := stored[[2]int{w, s}]
				for _, k := range state[w].acked {
					ts := base + int64(k)*stepMs
					v, ok := m[ts]
					require.True(t, ok, "writer %d series %d: acked request %d (t=%d) lost", w, s, k, ts)
					require.Equal(t, strconv.FormatFloat(sampleValue(k, s), 'f', -1, 64), v, "writer %d series %d request %d", w, s, k)
				}
				for ts, v := range m {
					k := int((ts - base) / stepMs)
					require.True(t, (ts-base)%stepMs == 0 && k >= 0 && k < state[w].next, "writer %d series %d: sample at %d was never sent", w, s, ts)
					require.Equal(t, strconv.FormatFloat(sampleValue(k, s), 'f', -1, 64), v)
				}
			}
		}
	}

	for round := range crashes {
		rcv := startReceiver(t, cfg, data)
		if round > 0 {
			verify(rcv.URL())
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				client := &http.Client{Timeout: 10 * time.Second}
				st := &state[w]
				for ; st.next < maxReqs; st.next++ {
					select {
					case <-stop:
						return
					default:
					}
					k := st.next
					req := &prompb.WriteRequest{}
					for s := range perWriter {
						req.Timeseries = append(req.Timeseries, prompb.TimeSeries{
							Labels:  labelsOf("__name__", "crash_test", "series", strconv.Itoa(s), "writer", strconv.Itoa(w)),
							Samples: []prompb.Sample{{Timestamp: base + int64(k)*stepMs, Value: sampleValue(k, s)}},
						})
					}
					raw, err := req.Marshal() // no require: this is not the test goroutine
					if err != nil {
						panic(err)
					}
					code, _, err := postWrite(client, rcv.URL(), tokenAcme, snappy.Encode(nil, raw), nil)
					if err == nil && code/100 == 2 {
						st.acked = append(st.acked, k)
						ackedTotal.Add(1)
					}
				}
			}()
		}
		// Kill once this round has had a good share of acknowledged writes,
		// while the writers are still sending.
		before := ackedTotal.Load()
		eventually(t, time.Minute, func() error {
			if n := ackedTotal.Load() - before; n < 300 {
				return fmt.Errorf("%d writes acknowledged this round", n)
			}
			return nil
		})
		rcv.Kill()
		close(stop)
		wg.Wait()
		t.Logf("round %d: %d writes acknowledged so far", round, ackedTotal.Load())
		for w := range writers {
			require.Less(t, state[w].next, maxReqs, "writer %d ran out of requests before the kill", w)
		}
	}

	rcv := startReceiver(t, cfg, data)
	verify(rcv.URL())
	rcv.Stop() // after three crashes it still shuts down cleanly
}
