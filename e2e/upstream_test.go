package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestUpstreamForwardToPrometheus runs the receiver in forward mode with
// Debian's Prometheus (--web.enable-remote-write-receiver) as the upstream.
// forward_only: authenticated writes arrive in Prometheus exactly, are not
// stored locally, and writes accepted while Prometheus is down are queued
// and delivered once it is back (nothing lost). also: writes are stored
// locally and arrive in Prometheus.
func TestUpstreamForwardToPrometheus(t *testing.T) {
	dir := t.TempDir()
	promAddr := freeAddr(t)
	promDir := filepath.Join(dir, "prometheus")
	require.NoError(t, os.MkdirAll(promDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(promDir, "prometheus.yml"), []byte("global:\n  scrape_interval: 1m\n"), 0o600))
	startProm := func() *Process {
		p := startProcess(t, "/usr/bin/prometheus", "prometheus", []string{
			"--config.file=" + filepath.Join(promDir, "prometheus.yml"),
			"--storage.tsdb.path=" + filepath.Join(promDir, "data"),
			"--web.listen-address=" + promAddr,
			"--web.enable-remote-write-receiver",
			"--log.format=json",
		}, func(line string) (string, bool) {
			return promAddr, strings.Contains(line, "Server is ready to receive web requests")
		})
		waitHTTP(t, p.URL()+"/-/ready", http.StatusOK)
		return p
	}
	prom := startProm()

	tokenFile := filepath.Join(dir, "upstream-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("upstream-secret\n"), 0o600))
	receiverWithUpstream := func(name, mode string) *Process {
		rdir := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(rdir, 0o755))
		cfg := writeReceiverConfig(t, rdir, "", "")
		f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = fmt.Fprintf(f, `upstream:
  url: http://%s/api/v1/write
  bearer_token_file: %s
  mode: %s
  timeout: 5s
  queue:
    max_bytes: 16MiB
    min_backoff: 100ms
    max_backoff: 1s
`, promAddr, tokenFile, mode)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		return startReceiver(t, cfg, filepath.Join(rdir, "data"))
	}
	rcv := receiverWithUpstream("forward-only", "forward_only")

	base := time.Now().Add(-10 * time.Minute).Truncate(time.Second).UnixMilli()
	want := map[string][]string{} // cluster -> "ts value" pairs as the API renders them
	write := func(rcv *Process, metric string, from, to int) {
		t.Helper()
		req := &prompb.WriteRequest{}
		for c := range 3 {
			cluster := fmt.Sprintf("c%d", c)
			ts := prompb.TimeSeries{Labels: labelsOf("__name__", metric, "_id", cluster)}
			for j := from; j < to; j++ {
				tsMs, v := base+int64(j)*15_000, float64(c*100+j)+0.25
				ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: tsMs, Value: v})
				want[metric+"/"+cluster] = append(want[metric+"/"+cluster],
					fmt.Sprintf("%s %s", formatTime(time.UnixMilli(tsMs)), strconv.FormatFloat(v, 'f', -1, 64)))
			}
			req.Timeseries = append(req.Timeseries, ts)
		}
		mustWrite(t, rcv.URL(), tokenAcme, req)
	}
	// arrived polls Prometheus until metric's series hold exactly what was written.
	arrived := func(metric string) {
		t.Helper()
		eventually(t, time.Minute, func() error {
			got, err := rangeQuery(prom.URL(), metric+"[1h]")
			if err != nil {
				return err
			}
			w := map[string][]string{}
			for k, v := range want {
				if strings.HasPrefix(k, metric+"/") {
					w[strings.TrimPrefix(k, metric+"/")] = v
				}
			}
			if !reflect.DeepEqual(w, got) {
				return fmt.Errorf("prometheus has %v, want %v", got, w)
			}
			return nil
		})
	}

	write(rcv, "upstream_e2e", 0, 10)
	arrived("upstream_e2e")
	// forward_only: nothing stored locally.
	r := instant(t, rcv.URL(), tokenAcme, "upstream_e2e", time.UnixMilli(base+9*15_000))
	require.Empty(t, r.Result)

	// Upstream briefly down: writes are still accepted (queued on disk),
	// retried with backoff, and delivered once Prometheus is back.
	prom.Stop()
	write(rcv, "upstream_e2e", 10, 20)
	write(rcv, "upstream_e2e", 20, 30)
	eventually(t, 30*time.Second, func() error {
		if v := metricValue(scrapeMetrics(t, rcv.URL()), "phonehome_upstream_retries_total", nil); v < 1 {
			return fmt.Errorf("retries %v", v)
		}
		return nil
	})
	require.Equal(t, 2.0, metricValue(scrapeMetrics(t, rcv.URL()), "phonehome_upstream_queue_requests", nil))
	prom = startProm()
	arrived("upstream_e2e")
	mfs := scrapeMetrics(t, rcv.URL())
	require.Equal(t, 90.0, metricValue(mfs, "phonehome_upstream_sent_samples_total", nil))
	require.Equal(t, 0.0, metricValue(mfs, "phonehome_upstream_dropped_samples_total", map[string]string{"reason": "http_4xx"}))
	require.Equal(t, 0.0, metricValue(mfs, "phonehome_upstream_queue_requests", nil))

	// also: stored locally and forwarded.
	also := receiverWithUpstream("also", "also")
	write(also, "upstream_also", 0, 10)
	arrived("upstream_also")
	r = instant(t, also.URL(), tokenAcme, "upstream_also", time.UnixMilli(base+9*15_000))
	require.Len(t, r.Result, 3)
}

// rangeQuery runs an instant query for a range vector on a Prometheus API and
// returns the samples per _id as "ts value" pairs.
func rangeQuery(base, q string) (map[string][]string, error) {
	resp, err := http.Get(base + "/api/v1/query?" + url.Values{"query": {q}, "time": {formatTime(time.Now())}}.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return nil, err
	}
	if env.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, env.Error)
	}
	var r queryResult
	if err := json.Unmarshal(env.Data, &r); err != nil {
		return nil, err
	}
	got := map[string][]string{}
	for _, s := range r.Result {
		for _, v := range s.Values {
			got[s.Metric["_id"]] = append(got[s.Metric["_id"]], fmt.Sprintf("%s %s", v[0], v[1]))
		}
	}
	return got, nil
}
