package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/receive"
	"github.com/phonehome/phonehome/storage"
)

// countingWriter stores nothing: the benchmark measures what differs between
// the versions (decode, conversion, validation, admission), not the TSDB
// append, which is the same for both.
type countingWriter struct{}

func (countingWriter) Write(_ context.Context, _ string, series []prompb.TimeSeries) (storage.Stats, error) {
	var st storage.Stats
	for _, ts := range series {
		st.Samples += len(ts.Samples)
	}
	return st, nil
}

// encodeV2 symbolizes a fleet batch as a remote-write 2.0 request, as a 2.0
// forwarder would (one symbol table per request).
func encodeV2(tb testing.TB, series []prompb.TimeSeries) []byte {
	st := writev2.NewSymbolTable()
	req := writev2.Request{Timeseries: make([]writev2.TimeSeries, len(series))}
	sb := labels.NewScratchBuilder(0)
	for i, ts := range series {
		req.Timeseries[i] = writev2.TimeSeries{
			LabelsRefs: st.SymbolizeLabels(ts.ToLabels(&sb, nil), nil),
			Samples:    []writev2.Sample{{Value: ts.Samples[0].Value, Timestamp: ts.Samples[0].Timestamp}},
		}
	}
	req.Symbols = st.Symbols()
	raw, err := req.Marshal()
	require.NoError(tb, err)
	return snappy.Encode(nil, raw)
}

func encodeV1(tb testing.TB, series []prompb.TimeSeries) []byte {
	raw, err := (&prompb.WriteRequest{Timeseries: series}).Marshal()
	require.NoError(tb, err)
	return snappy.Encode(nil, raw)
}

// BenchmarkReceiveRemoteWrite compares the receiver's CPU per sample and the
// bytes on the wire of remote-write 1.0 and 2.0 for fleet-shaped requests
// (one cluster's allowlisted series per request). Results:
// bench/results/remote-write-2.md.
func BenchmarkReceiveRemoteWrite(b *testing.B) {
	tmpl := templates(b)
	const clusters = 16
	for _, batch := range []int{224, 2000} {
		f, err := New(tmpl, clusters, batch, 1)
		require.NoError(b, err)
		var fb Batch
		v1, v2 := make([][]byte, clusters), make([][]byte, clusters)
		for c := range clusters {
			f.Fill(&fb, c, 0, batch, 0, time.Now().UnixMilli(), 30_000)
			v1[c], v2[c] = encodeV1(b, fb.Series), encodeV2(b, fb.Series)
		}
		for _, version := range []struct {
			name, contentType string
			bodies            [][]byte
		}{
			{"v1", contentTypeV1, v1},
			{"v2", contentTypeV2, v2},
		} {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, version.name), func(b *testing.B) {
				lim := unlimitedRates(nil)
				h := receive.NewHandler(slog.New(slog.DiscardHandler), nil, countingWriter{}, lim, receive.Options{})
				wire := 0
				for _, body := range version.bodies {
					wire += len(body)
				}
				b.SetBytes(int64(wire / clusters))
				b.ReportAllocs()
				n := 0
				for b.Loop() {
					c := n % clusters
					postWrite(b, h, version.contentType, version.bodies[c], f.ClusterID(c))
					n++
				}
				samples := float64(n * batch)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/samples, "ns/sample")
				b.ReportMetric(samples/b.Elapsed().Seconds(), "samples/s")
				b.ReportMetric(float64(wire)/float64(clusters*batch), "wire-bytes/sample")
			})
		}
	}
}
