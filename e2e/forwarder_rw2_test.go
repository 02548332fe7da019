package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/relabel"
)

// Forwarder side of remote-write 2.0 (issue 9), with the real binaries and
// Debian's Prometheus 2.42.

// decodeQueuePayload decodes one queue payload: uvarint(n) + snappy 1.0
// (forwarders before 2.0 support) or 0x00 0x02 uvarint(n) + snappy 2.0.
func decodeQueuePayload(t *testing.T, payload []byte) *prompb.WriteRequest {
	t.Helper()
	v2 := len(payload) > 1 && payload[0] == 0x00 && payload[1] == 0x02
	if v2 {
		payload = payload[2:]
	}
	_, k := binary.Uvarint(payload)
	require.Positive(t, k)
	raw, err := snappy.Decode(nil, payload[k:])
	require.NoError(t, err)
	if !v2 {
		var req prompb.WriteRequest
		require.NoError(t, req.Unmarshal(raw))
		return &req
	}
	var r2 writev2.Request
	require.NoError(t, r2.Unmarshal(raw))
	req, err := forward.V2ToV1(&r2)
	require.NoError(t, err)
	return req
}

// nativeHistogramRegistry holds rpc_latency_seconds, a native histogram
// (factor 1.1, schema 3) of the 100 observations 0.01..1.00, and a gauge.
func nativeHistogramRegistry(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "rpc_latency_seconds", Help: "RPC latency.", NativeHistogramBucketFactor: 1.1,
	})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "build_info", Help: "Build information.", ConstLabels: prometheus.Labels{"version": "1.2.3"}})
	reg.MustRegister(h, g)
	for i := 1; i <= 100; i++ {
		h.Observe(float64(i) / 100)
	}
	g.Set(1)
	return reg
}

func scalarValue(t *testing.T, r queryResult) float64 {
	t.Helper()
	require.Len(t, r.Result, 1)
	var s string
	require.NoError(t, json.Unmarshal(r.Result[0].Value[1], &s))
	var v float64
	_, err := fmt.Sscan(s, &v)
	require.NoError(t, err)
	return v
}

func waitQuery(t *testing.T, base, token, q string, want func(float64) bool) float64 {
	t.Helper()
	var got float64
	eventually(t, 2*time.Minute, func() error {
		var r queryResult
		code, resp := apiGet(t, base, token, "/api/v1/query", url.Values{"query": {q}})
		if code != http.StatusOK {
			return fmt.Errorf("%s: %d %s", q, code, resp.Error)
		}
		if err := json.Unmarshal(resp.Data, &r); err != nil {
			return err
		}
		if len(r.Result) != 1 {
			return fmt.Errorf("%s: %d results", q, len(r.Result))
		}
		got = scalarValue(t, r)
		if !want(got) {
			return fmt.Errorf("%s = %v", q, got)
		}
		return nil
	})
	return got
}

func requireNoForwarderDrops(t *testing.T, fwd *Process) {
	t.Helper()
	mfs := scrapeMetrics(t, fwd.URL())
	for _, reason := range []string{"queue_full", "http_4xx", "invalid", "queue_error", "max_series", "max_bytes", "partial_write", "superseded"} {
		require.Zero(t, metricValue(mfs, "phonehome_forward_dropped_samples_total", map[string]string{"reason": reason}), reason)
	}
}

// Real Prometheus 2.42 (native histograms enabled) scrapes a protobuf
// exposition with a native histogram; its /federate emits it (as a float
// histogram in the protobuf format; checked: the text format omits it), the
// forwarder sends it in 2.0 and it is queryable at the receiver.
func TestForwarderRW2NativeHistogramsViaPrometheusE2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	exp := httptest.NewServer(promhttp.HandlerFor(nativeHistogramRegistry(t), promhttp.HandlerOpts{}))
	t.Cleanup(exp.Close)
	u, err := url.Parse(exp.URL)
	require.NoError(t, err)
	prom := startPrometheus(t, fmt.Sprintf(`
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: exporter
    static_configs:
      - targets: [%q]
`, u.Host), "--enable-feature=native-histograms")
	waitQuery(t, prom.URL(), "", "histogram_count(rpc_latency_seconds)", func(v float64) bool { return v == 100 })

	dir := t.TempDir()
	recv := startReceiver(t, writeForwarderReceiverConfig(t, dir, hashedID), filepath.Join(dir, "data"))
	fwd := startBinary(t, "forwarder", forwarderArgs(t, prom.URL(), recv.URL(), filepath.Join(dir, "queue"),
		"--interval=2s", `--match={__name__=~"rpc_latency_seconds|build_info"}`)...)

	sel := fmt.Sprintf(`rpc_latency_seconds{_id=%q}`, hashedID)
	waitQuery(t, recv.URL(), fwdReadToken, "histogram_count("+sel+")", func(v float64) bool { return v == 100 })
	sum := waitQuery(t, recv.URL(), fwdReadToken, "histogram_sum("+sel+")", func(float64) bool { return true })
	require.InDelta(t, 50.5, sum, 1e-9)
	q := waitQuery(t, recv.URL(), fwdReadToken, "histogram_quantile(0.5, "+sel+")", func(float64) bool { return true })
	require.InDelta(t, 0.5, q, 0.05, "median of 0.01..1.00 within the schema-3 bucket width")

	// Prometheus' federation carries the type only (no HELP): the histogram
	// type arrives as 2.0 per-series metadata.
	var md map[string][]metadata.Metadata
	eventually(t, time.Minute, func() error {
		apiData(t, recv.URL(), fwdReadToken, "/api/v1/metadata", url.Values{"metric": {"rpc_latency_seconds"}}, &md)
		if len(md["rpc_latency_seconds"]) == 0 {
			return fmt.Errorf("no metadata yet: %v", md)
		}
		return nil
	})
	require.Equal(t, "histogram", string(md["rpc_latency_seconds"][0].Type))

	mfs := scrapeMetrics(t, fwd.URL())
	require.Equal(t, 2.0, metricValue(mfs, "phonehome_forward_remote_write_version", nil))
	require.Zero(t, fallbacksTotal(t, mfs))
	requireNoForwarderDrops(t, fwd)
}

// HELP and UNIT, which Prometheus' /federate does not carry, survive from a
// protobuf exposition (a /federate stand-in) to the receiver's metadata API,
// with the native histogram.
func TestForwarderRW2MetadataE2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	mfs, err := nativeHistogramRegistry(t).Gather()
	require.NoError(t, err)
	now := time.Now().UnixMilli()
	for _, mf := range mfs {
		if mf.GetName() == "rpc_latency_seconds" {
			mf.Unit = proto.String("seconds")
		}
		for _, m := range mf.Metric {
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String("job"), Value: proto.String("exporter")})
		}
	}
	fed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		format := expfmt.NegotiateAccept(r.Header, expfmt.DefaultAcceptedFormats()...)
		if r.URL.Path != "/federate" || format.FormatType() != expfmt.TypeProtoDelim {
			http.Error(w, "want /federate in protobuf", http.StatusNotAcceptable)
			return
		}
		ts := time.Now().UnixMilli()
		w.Header().Set("Content-Type", string(format))
		enc := expfmt.NewEncoder(w, format)
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				m.TimestampMs = proto.Int64(max(ts, now))
			}
			_ = enc.Encode(mf)
		}
	}))
	t.Cleanup(fed.Close)

	dir := t.TempDir()
	recv := startReceiver(t, writeForwarderReceiverConfig(t, dir, hashedID), filepath.Join(dir, "data"))
	_ = startBinary(t, "forwarder", forwarderArgs(t, fed.URL, recv.URL(), filepath.Join(dir, "queue"),
		"--interval=2s", `--match={__name__=~"rpc_latency_seconds|build_info"}`)...)

	sel := fmt.Sprintf(`rpc_latency_seconds{_id=%q}`, hashedID)
	waitQuery(t, recv.URL(), fwdReadToken, "histogram_count("+sel+")", func(v float64) bool { return v == 100 })
	var md map[string][]metadata.Metadata
	eventually(t, time.Minute, func() error {
		apiData(t, recv.URL(), fwdReadToken, "/api/v1/metadata", nil, &md)
		if len(md) < 2 {
			return fmt.Errorf("metadata so far: %v", md)
		}
		return nil
	})
	require.Equal(t, map[string][]metadata.Metadata{
		"rpc_latency_seconds": {{Type: "histogram", Help: "RPC latency.", Unit: "seconds"}},
		"build_info":          {{Type: "gauge", Help: "Build information."}},
	}, md)
}

// storedSamples returns every sample of the series matching sel in the
// last 15 minutes, as sampleKey strings.
func storedSamples(t *testing.T, base, token, sel string) map[string]bool {
	t.Helper()
	r := instant(t, base, token, sel+"[15m]", time.Now())
	out := map[string]bool{}
	for _, s := range r.Result {
		ls := labels.FromMap(s.Metric)
		for _, v := range s.Values {
			ts, err := v[0].Float64()
			require.NoError(t, err)
			val, err := v[1].Float64()
			require.NoError(t, err)
			out[sampleKey(ls, int64(ts*1000+0.5), val)] = true
		}
	}
	return out
}

func requireAllStored(t *testing.T, want, stored map[string]bool) {
	t.Helper()
	var missing []string
	for k := range want {
		if !stored[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "%d of %d samples missing (e.g. %s)", len(missing), len(want), strings.Join(missing[:min(3, len(missing))], "; "))
}

// The receiver accepts only 1.0: a backlog queued in the 2.0 form is
// re-encoded after the 415, every sample arrives, and the fallback is
// remembered across a restart.
func TestForwarderRW2FallbackTo1E2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	prom := startFixturePrometheus(t, fixtureExporter(t))
	waitFederated(t, prom.URL())

	dir := t.TempDir()
	queueDir := filepath.Join(dir, "queue")
	recvAddr := freeAddr(t)
	to := "http://" + recvAddr

	// Run 1: the receiver is down; cycles are queued (in the 2.0 form).
	fwd1 := startBinary(t, "forwarder", forwarderArgs(t, prom.URL(), to, queueDir, "--interval=1s")...)
	waitCycles(t, fwd1.URL(), 2)
	fwd1.Stop()
	backlog, cycles := queuedSamples(t, queueDir)
	require.GreaterOrEqual(t, cycles, 2, "two cycles are queued on disk")
	require.GreaterOrEqual(t, len(backlog), 224, "at least one whole cycle of distinct samples")

	cfg := writeForwarderReceiverConfig(t, dir, hashedID)
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("remote_write:\n  accepted_protobuf_messages: [prometheus.WriteRequest]\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	recv := startReceiver(t, cfg, filepath.Join(dir, "data"), "--web.listen-address="+recvAddr)

	// Run 2: 2.0 is refused with 415, the forwarder falls back and delivers everything.
	fwd2 := startBinary(t, "forwarder", forwarderArgs(t, prom.URL(), to, queueDir, "--interval=1s")...)
	eventually(t, 2*time.Minute, func() error {
		mfs := scrapeMetrics(t, fwd2.URL())
		records := metricValue(mfs, "phonehome_forward_queue_records", nil)
		queued := metricValue(mfs, "phonehome_forward_queued_samples_total", nil)
		sent := metricValue(mfs, "phonehome_forward_sent_samples_total", nil)
		if records != 0 || queued == 0 || sent < queued+float64(len(backlog)) {
			return fmt.Errorf("records=%v queued=%v sent=%v backlog=%d", records, queued, sent, len(backlog))
		}
		return nil
	})
	mfs := scrapeMetrics(t, fwd2.URL())
	require.Equal(t, 1.0, metricValue(mfs, "phonehome_forward_remote_write_fallbacks_total", map[string]string{"reason": "unsupported_media_type"}))
	require.Equal(t, 1.0, metricValue(mfs, "phonehome_forward_remote_write_version", nil))
	require.Positive(t, metricValue(mfs, "phonehome_forward_send_requests_total", map[string]string{"code": "2xx"}))
	requireNoForwarderDrops(t, fwd2)
	fwd2.Stop()
	requireAllStored(t, backlog, storedSamples(t, recv.URL(), fwdReadToken, fmt.Sprintf(`{_id=%q}`, hashedID)))
	require.Positive(t, metricsValue(t, recv.URL(), "phonehome_receive_requests_total", map[string]string{"code": "415"}))

	state, err := os.ReadFile(filepath.Join(queueDir, "remote-write-version.json"))
	require.NoError(t, err)
	require.Contains(t, string(state), `"reason":"unsupported_media_type"`)

	// Run 3: the fallback is remembered, 2.0 is not tried again.
	before := metricsValue(t, recv.URL(), "phonehome_receive_requests_total", map[string]string{"code": "415"})
	fwd3 := startBinary(t, "forwarder", forwarderArgs(t, prom.URL(), to, queueDir, "--interval=1s")...)
	eventually(t, time.Minute, func() error {
		if v := metricsValue(t, fwd3.URL(), "phonehome_forward_sent_samples_total", nil); v < 224 {
			return fmt.Errorf("%v sent", v)
		}
		return nil
	})
	mfs = scrapeMetrics(t, fwd3.URL())
	require.Equal(t, 1.0, metricValue(mfs, "phonehome_forward_remote_write_version", nil))
	require.Zero(t, fallbacksTotal(t, mfs))
	fwd3.Stop()
	require.Equal(t, before, metricsValue(t, recv.URL(), "phonehome_receive_requests_total", map[string]string{"code": "415"}))
}

// Debian's Prometheus 2.42 as the --to target (it has no /authorize, so
// --authorize=auto falls back on its 404): with --remote-write.version=1
// everything arrives; with auto, its answer to the 2.0 body (a 2xx without
// written counts) makes the forwarder re-send the same data in 1.0.
func TestForwarderRW2AgainstPrometheusE2E(t *testing.T) {
	src := startFixturePrometheus(t, fixtureExporter(t))
	waitFederated(t, src.URL())
	dst := startPrometheus(t, "global: {}\n", "--web.enable-remote-write-receiver")

	for _, tc := range []struct {
		version, id, fallback string
	}{
		{"1", fwdClusterID, ""},
		// Observed: 2.42 decodes a 2.0 body as an empty 1.0 request (the 2.0
		// fields are unknown to it) and answers 204 without written counts.
		{"auto", "0b6c1d2e-auto-fallback-cluster", "missing_written_headers"},
	} {
		t.Run(tc.version, func(t *testing.T) {
			hashedID := relabel.Anonymize([]byte(fwdSalt), tc.id)
			queueDir := filepath.Join(t.TempDir(), "queue")
			fwd := startBinary(t, "forwarder", forwarderArgs(t, src.URL(), dst.URL(), queueDir,
				"--interval=1s", "--remote-write.version="+tc.version, "--id="+tc.id)...)
			eventually(t, 2*time.Minute, func() error {
				mfs := scrapeMetrics(t, fwd.URL())
				queued := metricValue(mfs, "phonehome_forward_queued_samples_total", nil)
				sent := metricValue(mfs, "phonehome_forward_sent_samples_total", nil)
				if queued < 2*224 || sent != queued {
					return fmt.Errorf("queued=%v sent=%v", queued, sent)
				}
				return nil
			})
			mfs := scrapeMetrics(t, fwd.URL())
			requireNoForwarderDrops(t, fwd)
			require.Equal(t, 1.0, metricValue(mfs, "phonehome_forward_remote_write_version", nil))
			require.Positive(t, metricValue(mfs, "phonehome_forward_authorize_requests_total", map[string]string{"result": "not_found"}),
				"Prometheus has no /authorize: auto uses the token directly")
			if tc.fallback != "" {
				require.Equal(t, 1.0, metricValue(mfs, "phonehome_forward_remote_write_fallbacks_total", map[string]string{"reason": tc.fallback}))
			} else {
				require.Zero(t, fallbacksTotal(t, mfs))
			}
			fwd.Stop()

			// Every series arrives, and at least every sample acknowledged
			// when the counters above were read (more cycles may follow).
			sel := fmt.Sprintf(`{_id=%q}`, hashedID)
			require.Len(t, querySeriesNoAuth(t, dst.URL(), sel).Result, 224)
			sent := metricValue(mfs, "phonehome_forward_sent_samples_total", nil)
			require.GreaterOrEqual(t, float64(len(storedSamples(t, dst.URL(), "", sel))), sent, "every acknowledged sample is stored")
		})
	}
}

func querySeriesNoAuth(t *testing.T, base, sel string) queryResult {
	t.Helper()
	return instant(t, base, "", sel, time.Now())
}

// fallbacksTotal sums phonehome_forward_remote_write_fallbacks_total over its reasons.
func fallbacksTotal(t *testing.T, mfs map[string]*dto.MetricFamily) float64 {
	t.Helper()
	mf, ok := mfs["phonehome_forward_remote_write_fallbacks_total"]
	require.True(t, ok, "fallback counter exported")
	var n float64
	for _, m := range mf.GetMetric() {
		n += m.GetCounter().GetValue()
	}
	return n
}
