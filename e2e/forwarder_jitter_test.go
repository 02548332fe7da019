package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/relabel"
)

// Issue 20: forwarders started at the same instant must not collect in
// lockstep. Each wait between collections is --interval ± 10 % and the first
// collection starts after a random [0, 10 %) of the interval.
//
// Why the bounds cannot pass by luck with jitter off, nor flake with it on:
//   - Without jitter, consecutive federate requests of one forwarder are at
//     least --interval apart (the wait starts after the previous collection
//     returned), so "some gap below 0.99×interval" is impossible. With it,
//     each of the 25 gaps is below that with p ≥ 0.2 even if a collection
//     took 100 ms, so all 25 miss with p < 0.4 % (< 1e-5 at 30 ms).
//   - Without jitter every first_in is 0; with it, all five are below
//     1 % of the interval with p = 1e-5.
//   - 25 uniform gaps over a 20 % band span less than half of it with
//     p ≈ 1.5e-6.
func TestForwarderJitterE2E(t *testing.T) {
	const (
		n        = 5
		interval = 2 * time.Second
		requests = 6 // per forwarder: 5 gaps each
	)

	// Fixture "Prometheus": forwarder i federates /f<i>/federate; every
	// request's arrival is recorded. Samples carry no timestamp (now).
	var (
		mu       sync.Mutex
		arrivals = make([][]time.Time, n)
	)
	fixture := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/f"), "/federate"))
		if err != nil || i < 0 || i >= n {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		arrivals[i] = append(arrivals[i], at)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "up{job=\"fixture\",instance=\"f%d\"} 1\n", i)
	}))
	t.Cleanup(fixture.Close)

	dir := t.TempDir()
	salt := filepath.Join(dir, "salt")
	require.NoError(t, os.WriteFile(salt, []byte(fwdSalt+"\n"), 0o600))
	var tokens strings.Builder
	tokens.WriteString("tokens:\n")
	for i := range n {
		fmt.Fprintf(&tokens, "- token: \"jitter-%d\"\n  tenant: fleet\n  cluster_id: %q\n", i, relabel.Anonymize([]byte(fwdSalt), fmt.Sprintf("cluster-%d", i)))
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("token-%d", i)), fmt.Appendf(nil, "jitter-%d\n", i), 0o600))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokens.String()), 0o600))
	cfg := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("auth:\n  tokens_file: tokens.yaml\n"), 0o600))
	recv := startReceiver(t, cfg, filepath.Join(dir, "data"))

	// What each forwarder logged when it started collecting.
	type start struct {
		at      time.Time
		firstIn time.Duration
	}
	starts := make([]*start, n)
	procs := make([]*Process, n)
	addrcs := make([]<-chan string, n)
	for i := range n { // all started before any is waited for
		args := []string{
			"--from=" + fmt.Sprintf("%s/f%d", fixture.URL, i), "--to=" + recv.URL(),
			"--to-token-file=" + filepath.Join(dir, fmt.Sprintf("token-%d", i)), "--authorize=never",
			"--id=" + fmt.Sprintf("cluster-%d", i), "--anonymize-salt-file=" + salt,
			"--match=up", "--interval=" + interval.String(),
			"--queue.dir=" + filepath.Join(dir, fmt.Sprintf("queue-%d", i)),
			"--listen=127.0.0.1:0", "--log.format=json",
		}
		procs[i], addrcs[i] = launchProcess(t, filepath.Join(binDir, "forwarder"), fmt.Sprintf("forwarder-%d", i), args, func(line string) (string, bool) {
			var rec struct {
				Time    time.Time
				Msg     string
				FirstIn string `json:"first_in"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "collecting" {
				d, err := time.ParseDuration(rec.FirstIn)
				if err == nil {
					mu.Lock()
					starts[i] = &start{at: rec.Time, firstIn: d}
					mu.Unlock()
				}
			}
			return listeningFromJSON(line)
		})
	}
	for i, p := range procs {
		p.waitListening(addrcs[i])
	}

	eventually(t, time.Minute, func() error {
		mu.Lock()
		defer mu.Unlock()
		for i, a := range arrivals {
			if len(a) < requests || starts[i] == nil {
				return fmt.Errorf("forwarder %d: %d collections", i, len(a))
			}
		}
		return nil
	})
	for _, p := range procs {
		require.Positive(t, metricsValue(t, p.URL(), "phonehome_forward_sent_samples_total", nil), "%s delivered", p.name)
		p.Stop()
	}

	mu.Lock()
	defer mu.Unlock()
	var (
		gaps     []time.Duration
		firstIns []time.Duration
	)
	for i, a := range arrivals {
		s := starts[i]
		// The first collection waited the delay the forwarder drew.
		require.GreaterOrEqual(t, s.firstIn, time.Duration(0))
		require.Less(t, s.firstIn, interval/10, "forwarder %d: first collection within 10 %% of the interval", i)
		waited := a[0].Sub(s.at)
		require.GreaterOrEqual(t, waited, s.firstIn-10*time.Millisecond, "forwarder %d collected before its start delay", i)
		require.Less(t, waited, s.firstIn+time.Second, "forwarder %d", i)
		firstIns = append(firstIns, s.firstIn)
		for k := 1; k < requests; k++ {
			gaps = append(gaps, a[k].Sub(a[k-1]))
		}
	}
	t.Logf("first_in %v; gaps %v", firstIns, gaps)
	require.Greater(t, slices.Max(firstIns), interval/100, "first collections are not simultaneous: %v", firstIns)

	lo, hi := slices.Min(gaps), slices.Max(gaps)
	// Within the documented ±10 % (a request's latency may vary a little;
	// a collection's own duration and a busy machine only add).
	require.GreaterOrEqual(t, lo, interval*9/10-50*time.Millisecond, "gaps %v", gaps)
	require.LessOrEqual(t, hi, interval*11/10+time.Second, "gaps %v", gaps)
	require.Less(t, lo, interval*99/100, "some wait shorter than the interval: jitter is applied (gaps %v)", gaps)
	require.Greater(t, hi-lo, interval/10, "waits spread over the ±10 %% band (gaps %v)", gaps)
}
