package forward

import (
	"errors"
	"io"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
	"github.com/stretchr/testify/require"
)

// benchSeries parses n synthetic federated series (the fixture's shape) and
// applies the fixture's relabel rules (rename, _id), as Collect would.
func benchSeries(b *testing.B, n int) ([]labels.Labels, []prompb.Sample) {
	b.Helper()
	p := textparse.NewPromParser(syntheticFederate(b, n), labels.NewSymbolTable(), false)
	rules := fixturePolicy(b).Rules
	var (
		lss     []labels.Labels
		samples []prompb.Sample
	)
	for {
		e, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(b, err)
		if e != textparse.EntrySeries {
			continue
		}
		_, ts, v := p.Series()
		var ls labels.Labels
		p.Labels(&ls)
		lb := labels.NewBuilder(ls)
		require.True(b, rules.Apply(lb))
		lss = append(lss, lb.Labels())
		samples = append(samples, prompb.Sample{Value: v, Timestamp: *ts})
	}
	require.Len(b, lss, n)
	return lss, samples
}

func encodeV1(lss []labels.Labels, samples []prompb.Sample) ([]byte, int, error) {
	req := prompb.WriteRequest{Timeseries: make([]prompb.TimeSeries, len(lss))}
	for i, ls := range lss {
		req.Timeseries[i] = prompb.TimeSeries{Labels: prompb.FromLabels(ls, nil), Samples: samples[i : i+1]}
	}
	raw, err := req.Marshal()
	if err != nil {
		return nil, 0, err
	}
	return snappy.Encode(nil, raw), len(raw), nil
}

func encodeV2(lss []labels.Labels, samples []prompb.Sample) ([]byte, int, error) {
	st := writev2.NewSymbolTable()
	req := writev2.Request{Timeseries: make([]writev2.TimeSeries, len(lss))}
	for i, ls := range lss {
		req.Timeseries[i] = writev2.TimeSeries{
			LabelsRefs: st.SymbolizeLabels(ls, nil),
			Samples:    []writev2.Sample{{Value: samples[i].Value, Timestamp: samples[i].Timestamp}},
		}
	}
	req.Symbols = st.Symbols()
	raw, err := req.OptimizedMarshal(nil)
	if err != nil {
		return nil, 0, err
	}
	return snappy.Encode(nil, raw), len(raw), nil
}

// BenchmarkEncodeBatch encodes one 10k-series request (the fixture's label
// shape after relabeling, one float sample each) as remote-write 1.0 and 2.0
// (build + protobuf + snappy), and re-encodes a queued 2.0 record as 1.0 (the
// cost of a fallback). wire-B is the snappy body, raw-B the protobuf.
func BenchmarkEncodeBatch(b *testing.B) {
	const n = 10_000
	lss, samples := benchSeries(b, n)
	for _, tc := range []struct {
		name   string
		encode func() ([]byte, int, error)
	}{
		{"proto=1.0", func() ([]byte, int, error) { return encodeV1(lss, samples) }},
		{"proto=2.0", func() ([]byte, int, error) { return encodeV2(lss, samples) }},
		{"reencode=2.0to1.0", func() func() ([]byte, int, error) {
			body, _, err := encodeV2(lss, samples)
			require.NoError(b, err)
			rec := Record{Proto: ProtoV2, Body: body, Samples: n}
			return func() ([]byte, int, error) {
				out, err := rec.as(ProtoV1)
				return out, 0, err
			}
		}()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body, raw, err := tc.encode()
			require.NoError(b, err)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			iters := 0
			for b.Loop() {
				if _, _, err := tc.encode(); err != nil {
					b.Fatal(err)
				}
				iters++
			}
			b.ReportMetric(float64(len(body)), "wire-B")
			if raw > 0 {
				b.ReportMetric(float64(raw), "raw-B")
			}
			b.ReportMetric(float64(n*iters)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}
