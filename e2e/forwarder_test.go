package e2e

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/relabel"
)

// Forwarder end-to-end: real Prometheus scrapes a fixture exporter, the real
// forwarder federates from it and remote-writes to the real receiver.

const (
	fwdClusterID = "5f6c2a9e-3b1d-4c7e-9a0f-2d8e4b6c1a73" // the raw _id in the fixture
	fwdSalt      = "e2e-salt-0123456789abcdef"
	fwdToken     = "fwd-e2e-token"
	fwdReadToken = "fwd-e2e-read-token" // the forwarder's token is bound to its cluster: it may not read
	fwdFixtures  = "../bench/testdata"
)

// fixtureExporter serves federate-sample.prom as the text format.
func fixtureExporter(t *testing.T) *httptest.Server {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fwdFixtures, "federate-sample.prom"))
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func startFixturePrometheus(t *testing.T, exporter *httptest.Server) *Process {
	t.Helper()
	u, err := url.Parse(exporter.URL)
	require.NoError(t, err)
	return startPrometheus(t, fixtureScrapeConfig(u.Host))
}

// fixtureScrapeConfig is a Prometheus configuration that scrapes the
// fixture exporter at host every second, keeping its labels; a caller may
// append more top-level sections (remote_write:).
func fixtureScrapeConfig(host string) string {
	return fmt.Sprintf(`
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: fixture
    honor_labels: true
    honor_timestamps: false
    static_configs:
      - targets: [%q]
`, host)
}

// expectedSeries applies the forwarder's policy to the fixture and returns the
// series as strings without job and instance (which Prometheus' scrape sets).
// The fixture's prometheus and prometheus_replica, the external labels
// OpenShift's Prometheus adds on /federate, are elided (--elide-label's
// default).
func expectedSeries(t *testing.T, hashedID string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(fwdFixtures, "telemetry-allowlist.txt"))
	require.NoError(t, err)
	defer f.Close()
	al, err := allowlist.ParseReader(f)
	require.NoError(t, err)
	rules, err := relabel.Parse(relabel.Config{ID: fwdClusterID, Salt: []byte(fwdSalt), Rename: map[string]string{"ALERTS": "alerts"}})
	require.NoError(t, err)
	require.Equal(t, hashedID, rules.HashedID())
	b, err := os.ReadFile(filepath.Join(fwdFixtures, "federate-sample.prom"))
	require.NoError(t, err)
	p, err := textparse.New(b, "text/plain", labels.NewSymbolTable(), textparse.ParserOptions{})
	require.NoError(t, err)
	var out []string
	for {
		e, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if e != textparse.EntrySeries {
			continue
		}
		var ls labels.Labels
		p.Labels(&ls)
		if !al.Allows(ls) {
			continue
		}
		lb := labels.NewBuilder(ls)
		require.True(t, rules.Apply(lb))
		lb.Del("prometheus", "prometheus_replica")
		out = append(out, withoutTargetLabels(lb.Labels()))
	}
	sort.Strings(out)
	return out
}

func withoutTargetLabels(ls labels.Labels) string {
	return labels.NewBuilder(ls).Del("job", "instance").Labels().String()
}

// writeForwarderReceiverConfig writes a receiver config with two tokens:
// the forwarder's, bound to its hashed cluster id, and one that reads.
func writeForwarderReceiverConfig(t *testing.T, dir, hashedID string) string {
	t.Helper()
	tokens := fmt.Sprintf("tokens:\n- token: %q\n  tenant: fleet\n  cluster_id: %q\n- token: %q\n  tenant: fleet\n  allow: [read]\n", fwdToken, hashedID, fwdReadToken)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokens), 0o600))
	p := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(p, []byte("auth:\n  tokens_file: tokens.yaml\n"), 0o600))
	return p
}

// recordingProxy forwards to target and keeps every request body it sees.
type recordingProxy struct {
	mu     sync.Mutex
	bodies [][]byte
	srv    *httptest.Server
}

func newRecordingProxy(t *testing.T, target string) *recordingProxy {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	rp := &recordingProxy{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	rp.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rp.mu.Lock()
		rp.bodies = append(rp.bodies, b)
		rp.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(rp.srv.Close)
	return rp
}

func forwarderArgs(t *testing.T, prom, to, queueDir string, extra ...string) []string {
	t.Helper()
	dir := t.TempDir()
	salt := filepath.Join(dir, "salt")
	require.NoError(t, os.WriteFile(salt, []byte(fwdSalt+"\n"), 0o600))
	tok := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tok, []byte(fwdToken+"\n"), 0o600))
	cfg := filepath.Join(dir, "forwarder.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("send:\n  min_backoff: 100ms\n  max_backoff: 500ms\n  flush_timeout: 2s\n"), 0o600))
	return append([]string{
		"--from=" + prom, "--to=" + to, "--to-token-file=" + tok,
		"--id=" + fwdClusterID, "--anonymize-salt-file=" + salt,
		"--match-file=" + filepath.Join(fwdFixtures, "telemetry-allowlist.txt"),
		"--queue.dir=" + queueDir, "--config.file=" + cfg,
		"--listen=127.0.0.1:0", "--log.format=json",
	}, extra...)
}

// waitFederated waits until Prometheus has scraped the fixture.
func waitFederated(t *testing.T, prom string) {
	t.Helper()
	waitFederatedWith(t, http.DefaultClient, prom)
}

// waitFederatedWith is waitFederated over client (TLS, say).
func waitFederatedWith(t *testing.T, client *http.Client, prom string) {
	t.Helper()
	eventually(t, time.Minute, func() error {
		resp, err := client.Get(prom + "/federate?match[]=" + url.QueryEscape(`{__name__="cluster_version"}`))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !bytes.Contains(b, []byte("cluster_version{")) {
			return fmt.Errorf("fixture not scraped yet")
		}
		return nil
	})
}

func querySeries(t *testing.T, base, q string, ts time.Time) queryResult {
	t.Helper()
	return instant(t, base, fwdReadToken, q, ts)
}

func TestForwarderE2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	want := expectedSeries(t, hashedID)
	require.Len(t, want, 224)

	prom := startFixturePrometheus(t, fixtureExporter(t))
	waitFederated(t, prom.URL())

	dir := t.TempDir()
	recv := startReceiver(t, writeForwarderReceiverConfig(t, dir, hashedID), filepath.Join(dir, "data"))
	proxy := newRecordingProxy(t, recv.URL())
	fwd := startBinary(t, "forwarder", forwarderArgs(t, prom.URL(), proxy.srv.URL, filepath.Join(dir, "queue"), "--interval=2s")...)
	waitHTTP(t, "http://"+fwd.Addr+"/readyz", http.StatusOK)

	var got []string
	eventually(t, time.Minute, func() error {
		r := querySeries(t, recv.URL(), fmt.Sprintf(`{_id=%q}`, hashedID), time.Now())
		got = got[:0]
		for _, s := range r.Result {
			got = append(got, withoutTargetLabels(labels.FromMap(s.Metric)))
		}
		if len(got) < 224 {
			return fmt.Errorf("%d series arrived", len(got))
		}
		return nil
	})
	sort.Strings(got)
	require.Equal(t, want, got, "exactly the allowlisted series arrive, anonymized")

	// Nothing in the receiver carries another _id, nor the Prometheus
	// replica that answered /federate: a switch to the other replica would
	// write every series a second time.
	all := querySeries(t, recv.URL(), `{__name__=~".+"}`, time.Now())
	for _, s := range all.Result {
		require.Equal(t, hashedID, s.Metric["_id"], "%v", s.Metric)
		require.NotContains(t, s.Metric, "prometheus_replica", "elided")
		require.NotContains(t, s.Metric, "prometheus", "elided")
	}

	fwd.Stop()
	proxy.mu.Lock()
	defer proxy.mu.Unlock()
	require.NotEmpty(t, proxy.bodies)
	for _, b := range proxy.bodies {
		require.False(t, bytes.Contains(b, []byte(fwdClusterID)), "raw id in compressed bytes")
		if bytes.HasPrefix(b, []byte("id=")) { // --authorize=auto probing /authorize (404 here)
			require.Equal(t, url.Values{"id": {hashedID}}.Encode(), string(b))
			continue
		}
		raw, err := snappy.Decode(nil, b)
		require.NoError(t, err)
		require.False(t, bytes.Contains(raw, []byte(fwdClusterID)), "raw id in request bytes")
		require.True(t, bytes.Contains(raw, []byte(hashedID)))
	}
}

// queuedSamples decodes every record of a stopped forwarder's queue directory
// (segment format documented in forward/queue.go, payloads in forward/record.go) and returns the samples as
// "series@timestamp=value", and the number of records (one per cycle). Two
// cycles within one scrape interval of the source federate the same samples,
// so the distinct samples may be fewer than the records' sum.
func queuedSamples(t *testing.T, dir string) (out map[string]bool, records int) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	require.NoError(t, err)
	out = map[string]bool{}
	for _, seg := range segs {
		b, err := os.ReadFile(seg)
		require.NoError(t, err)
		for len(b) >= 16 {
			n := int(binary.BigEndian.Uint32(b[0:4]))
			payload := b[16 : 16+n]
			b = b[16+n:]
			req := decodeQueuePayload(t, payload)
			records++
			for _, ts := range req.Timeseries {
				for _, s := range ts.Samples {
					out[sampleKey(protoToLabels(ts.Labels), s.Timestamp, s.Value)] = true
				}
			}
		}
	}
	return out, records
}

func protoToLabels(ls []prompb.Label) labels.Labels {
	b := labels.NewScratchBuilder(len(ls))
	for _, l := range ls {
		b.Add(l.Name, l.Value)
	}
	b.Sort()
	return b.Labels()
}

func sampleKey(ls labels.Labels, ts int64, v float64) string {
	return fmt.Sprintf("%s@%d=%g", ls.String(), ts, v)
}

// waitCycles waits (up to a minute) until the forwarder at base has
// completed n collection cycles.
func waitCycles(t *testing.T, base string, n float64) {
	t.Helper()
	eventually(t, time.Minute, func() error {
		if v := metricsValue(t, base, "phonehome_forward_cycles_total", map[string]string{"result": "success"}); v < n {
			return fmt.Errorf("%v cycles", v)
		}
		return nil
	})
}

func metricsValue(t *testing.T, base, name string, lbls map[string]string) float64 {
	t.Helper()
	return metricValue(scrapeMetrics(t, base), name, lbls)
}

// The receiver is down for several cycles and the forwarder restarts once in
// between; afterwards every collected sample arrives with its original timestamp.
func TestForwarderOutageE2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	prom := startFixturePrometheus(t, fixtureExporter(t))
	waitFederated(t, prom.URL())

	dir := t.TempDir()
	queueDir := filepath.Join(dir, "queue")
	recvAddr := freeAddr(t)
	to := "http://" + recvAddr

	// Run 1: the receiver does not exist yet.
	fwd1 := startBinary(t, "forwarder", forwarderArgs(t, prom.URL(), to, queueDir, "--interval=1s")...)
	waitCycles(t, fwd1.URL(), 3)
	require.Positive(t, metricsValue(t, fwd1.URL(), "phonehome_forward_send_retries_total", nil))
	fwd1.Stop() // bounded flush fails (receiver down), exit 0

	backlog, cycles := queuedSamples(t, queueDir)
	require.GreaterOrEqual(t, cycles, 3, "at least three cycles are queued on disk")
	require.GreaterOrEqual(t, len(backlog), 224, "at least one whole cycle of distinct samples")

	// Run 2: restarted, still no receiver for a couple of cycles.
	fwd2 := startBinary(t, "forwarder", forwarderArgs(t, prom.URL(), to, queueDir, "--interval=1s")...)
	waitCycles(t, fwd2.URL(), 2)

	// The receiver returns.
	recv := startReceiver(t, writeForwarderReceiverConfig(t, dir, hashedID), filepath.Join(dir, "data"),
		"--web.listen-address="+recvAddr)
	eventually(t, 2*time.Minute, func() error {
		mfs := scrapeMetrics(t, fwd2.URL())
		records := metricValue(mfs, "phonehome_forward_queue_records", nil)
		queued := metricValue(mfs, "phonehome_forward_queued_samples_total", nil)
		sent := metricValue(mfs, "phonehome_forward_sent_samples_total", nil)
		if records != 0 || sent < queued+float64(len(backlog)) {
			return fmt.Errorf("records=%v queued=%v sent=%v backlog=%d", records, queued, sent, len(backlog))
		}
		return nil
	})
	mfs := scrapeMetrics(t, fwd2.URL())
	for _, reason := range []string{"queue_full", "http_4xx", "invalid", "queue_error", "max_series", "max_bytes"} {
		require.Zero(t, metricValue(mfs, "phonehome_forward_dropped_samples_total", map[string]string{"reason": reason}), reason)
	}
	fwd2.Stop()

	// Every backlog sample is in the receiver with its original timestamp.
	r := querySeries(t, recv.URL(), fmt.Sprintf(`{_id=%q}[15m]`, hashedID), time.Now())
	stored := map[string]bool{}
	for _, s := range r.Result {
		ls := labels.FromMap(s.Metric)
		for _, v := range s.Values {
			ts, err := v[0].Float64()
			require.NoError(t, err)
			val, err := v[1].Float64()
			require.NoError(t, err)
			stored[sampleKey(ls, int64(ts*1000+0.5), val)] = true
		}
	}
	var missing []string
	for k := range backlog {
		if !stored[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "%d of %d backlog samples missing (e.g. %s)", len(missing), len(backlog), strings.Join(missing[:min(3, len(missing))], "; "))
}
