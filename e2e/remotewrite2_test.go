package e2e

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"
)

// postWriteV2 sends a remote-write 2.0 request as the spec says and returns
// the status, the body and the three written-count headers.
func postWriteV2(t *testing.T, base, token string, req *writev2.Request) (int, string, [3]string) {
	t.Helper()
	raw, err := req.Marshal()
	require.NoError(t, err)
	r, err := http.NewRequest(http.MethodPost, base+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, raw)))
	require.NoError(t, err)
	r.Header.Set("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request")
	r.Header.Set("Content-Encoding", "snappy")
	r.Header.Set("X-Prometheus-Remote-Write-Version", "2.0.0")
	r.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	require.NoError(t, err)
	return resp.StatusCode, string(b), [3]string{
		resp.Header.Get("X-Prometheus-Remote-Write-Samples-Written"),
		resp.Header.Get("X-Prometheus-Remote-Write-Histograms-Written"),
		resp.Header.Get("X-Prometheus-Remote-Write-Exemplars-Written"),
	}
}

// TestRemoteWrite2 sends native histograms (integer and float), a counter
// with an exemplar, and metadata as remote-write 2.0 to the real receiver,
// and reads them back through the query API.
func TestRemoteWrite2(t *testing.T) {
	dir := t.TempDir()
	rcv := startReceiver(t, writeReceiverConfig(t, dir, "", "  max_exemplars: 100\n"), filepath.Join(dir, "data"))
	now := time.Now().Truncate(time.Second)
	ts := now.UnixMilli()

	st := writev2.NewSymbolTable()
	// Schema 0: buckets (0.5,1] and (1,2] with 2 observations each, so the
	// median is exactly 1.
	h := &histogram.Histogram{
		Schema: 0, Count: 4, Sum: 5,
		PositiveSpans: []histogram.Span{{Offset: 0, Length: 2}}, PositiveBuckets: []int64{2, 0},
	}
	fh := h.ToFloat(nil)
	fh.Count, fh.Sum, fh.PositiveBuckets = 8, 10, []float64{4, 4}
	req := &writev2.Request{Timeseries: []writev2.TimeSeries{
		{
			LabelsRefs: st.SymbolizeLabels(labels.FromStrings("__name__", "rpc_duration_seconds", "job", "api"), nil),
			Histograms: []writev2.Histogram{writev2.FromIntHistogram(0, ts, h)},
			Metadata:   writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_HISTOGRAM, HelpRef: st.Symbolize("RPC latency."), UnitRef: st.Symbolize("seconds")},
		},
		{
			LabelsRefs: st.SymbolizeLabels(labels.FromStrings("__name__", "queue_wait_seconds", "job", "api"), nil),
			Histograms: []writev2.Histogram{writev2.FromFloatHistogram(ts-60_000, ts, fh)},
			Metadata:   writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_HISTOGRAM, HelpRef: st.Symbolize("Queue wait."), UnitRef: st.Symbolize("seconds")},
		},
		{
			LabelsRefs: st.SymbolizeLabels(labels.FromStrings("__name__", "http_requests_total", "code", "200", "job", "api"), nil),
			Samples:    []writev2.Sample{{Value: 10, Timestamp: ts - 1000}, {Value: 12, Timestamp: ts}},
			Exemplars:  []writev2.Exemplar{{LabelsRefs: st.SymbolizeLabels(labels.FromStrings("trace_id", "4bf92f3577b34da6"), nil), Value: 1, Timestamp: ts}},
			Metadata:   writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_COUNTER, HelpRef: st.Symbolize("Requests served.")},
		},
	}}
	req.Symbols = st.Symbols()

	code, body, written := postWriteV2(t, rcv.URL(), tokenAcme, req)
	require.Equal(t, http.StatusNoContent, code, body)
	require.Equal(t, [3]string{"2", "2", "1"}, written, "samples, histograms, exemplars written")

	r := instant(t, rcv.URL(), tokenAcme, `histogram_quantile(0.5, rpc_duration_seconds)`, now)
	require.Len(t, r.Result, 1)
	require.Equal(t, `"1"`, string(r.Result[0].Value[1]))
	r = instant(t, rcv.URL(), tokenAcme, `histogram_count(queue_wait_seconds)`, now)
	require.Len(t, r.Result, 1)
	require.Equal(t, `"8"`, string(r.Result[0].Value[1]))
	r = instant(t, rcv.URL(), tokenAcme, `http_requests_total`, now)
	require.Len(t, r.Result, 1)
	require.Equal(t, `"12"`, string(r.Result[0].Value[1]))

	var md map[string][]metadata.Metadata
	apiData(t, rcv.URL(), tokenAcme, "/api/v1/metadata", nil, &md)
	require.Equal(t, map[string][]metadata.Metadata{
		"rpc_duration_seconds": {{Type: model.MetricTypeHistogram, Help: "RPC latency.", Unit: "seconds"}},
		"queue_wait_seconds":   {{Type: model.MetricTypeHistogram, Help: "Queue wait.", Unit: "seconds"}},
		"http_requests_total":  {{Type: model.MetricTypeCounter, Help: "Requests served."}},
	}, md)
	md = nil // Unmarshal merges into a non-nil map
	apiData(t, rcv.URL(), tokenAcme, "/api/v1/metadata", url.Values{"metric": {"http_requests_total"}}, &md)
	require.Len(t, md, 1)
	md = nil
	apiData(t, rcv.URL(), tokenOther, "/api/v1/metadata", nil, &md)
	require.Empty(t, md, "metadata is tenant-scoped")

	// A partial write: the bad series is reported, the good one written.
	bad := &writev2.Request{Symbols: req.Symbols, Timeseries: []writev2.TimeSeries{
		{LabelsRefs: req.Timeseries[2].LabelsRefs, Samples: []writev2.Sample{{Value: 13, Timestamp: ts + 1000}}},
		{LabelsRefs: []uint32{1, 9999}, Samples: []writev2.Sample{{Value: 1, Timestamp: ts}}},
	}}
	code, body, written = postWriteV2(t, rcv.URL(), tokenAcme, bad)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "outside of symbols table")
	require.Equal(t, [3]string{"1", "0", "0"}, written)

	// Metadata survives a restart (the head is flushed at shutdown, so it
	// comes from the receiver's own metadata file, not the WAL).
	rcv.Stop()
	rcv = startReceiver(t, filepath.Join(dir, "receiver.yaml"), filepath.Join(dir, "data"))
	md = nil
	apiData(t, rcv.URL(), tokenAcme, "/api/v1/metadata", url.Values{"metric": {"rpc_duration_seconds"}}, &md)
	require.Equal(t, map[string][]metadata.Metadata{
		"rpc_duration_seconds": {{Type: model.MetricTypeHistogram, Help: "RPC latency.", Unit: "seconds"}},
	}, md)
	r = instant(t, rcv.URL(), tokenAcme, `histogram_quantile(0.5, rpc_duration_seconds)`, now)
	require.Len(t, r.Result, 1)
	require.Equal(t, `"1"`, string(r.Result[0].Value[1]))
}

// TestRemoteWrite2RefusedWhenOnly1Accepted: a receiver configured with
// accepted_protobuf_messages: [prometheus.WriteRequest] answers 415 to 2.0
// (so a 2.0 sender falls back) and still takes 1.0.
func TestRemoteWrite2RefusedWhenOnly1Accepted(t *testing.T) {
	dir := t.TempDir()
	cfg := writeReceiverConfig(t, dir, "", "")
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("remote_write:\n  accepted_protobuf_messages: [prometheus.WriteRequest]\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	rcv := startReceiver(t, cfg, filepath.Join(dir, "data"))

	ts := time.Now().UnixMilli()
	st := writev2.NewSymbolTable()
	req := &writev2.Request{Timeseries: []writev2.TimeSeries{{
		LabelsRefs: st.SymbolizeLabels(labels.FromStrings("__name__", "up"), nil),
		Samples:    []writev2.Sample{{Value: 1, Timestamp: ts}},
	}}}
	req.Symbols = st.Symbols()
	code, body, written := postWriteV2(t, rcv.URL(), tokenAcme, req)
	require.Equal(t, http.StatusUnsupportedMediaType, code, body)
	require.Equal(t, [3]string{"0", "0", "0"}, written)

	mustWrite(t, rcv.URL(), tokenAcme, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels: labelsOf("__name__", "up"), Samples: []prompb.Sample{{Value: 1, Timestamp: ts}},
	}}})
}
