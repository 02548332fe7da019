package pushdown

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/tsdb/tsdbutil"
	"github.com/stretchr/testify/require"
)

func TestWireRoundTrip(t *testing.T) {
	want := &Result{
		Series: []promql.Series{
			{Metric: labels.FromStrings("name", "a"), Floats: []promql.FPoint{{T: 1, F: 2.5}, {T: 2, F: -1}}},
			{Metric: labels.FromStrings("name", "b"), Histograms: []promql.HPoint{{T: 3, H: tsdbutil.GenerateTestFloatHistogram(4)}}},
		},
		Keys:     []string{"", "c1"},
		Warnings: []string{"PromQL warning: a\nb"},
		Infos:    []string{"PromQL info: c"},
	}
	rec := httptest.NewRecorder()
	require.NoError(t, writeResult(rec, want))
	got, err := ReadResult(rec.Result())
	require.NoError(t, err)
	require.Equal(t, len(want.Series), len(got.Series))
	for i := range want.Series {
		require.Equal(t, want.Series[i].Metric.String(), got.Series[i].Metric.String())
		require.Equal(t, want.Series[i].Floats, got.Series[i].Floats)
		require.Equal(t, len(want.Series[i].Histograms), len(got.Series[i].Histograms))
		for j, h := range want.Series[i].Histograms {
			require.True(t, h.H.Equals(got.Series[i].Histograms[j].H))
		}
	}
	require.Equal(t, want.Keys, got.Keys)
	require.Equal(t, []string{"PromQL warning: a b"}, got.Warnings, "one header line each")
	require.Equal(t, want.Infos, got.Infos)
}

// FuzzReadResult: a peer's answer never panics the querier.
func FuzzReadResult(f *testing.F) {
	rec := httptest.NewRecorder()
	require.NoError(f, writeResult(rec, &Result{
		Series: []promql.Series{{Metric: labels.FromStrings("a", "b"), Floats: []promql.FPoint{{T: 1, F: 1}}}},
		Keys:   []string{"c1"},
	}))
	f.Add(rec.Body.Bytes())
	f.Add([]byte{})
	f.Add([]byte("\xff\xff\xff\xff\x0f"))
	f.Fuzz(func(_ *testing.T, body []byte) {
		_, _ = ReadResult(&http.Response{Body: io.NopCloser(bytes.NewReader(body)), Header: http.Header{}})
	})
}

// FuzzDecodeRequest: any form either fails or round-trips.
func FuzzDecodeRequest(f *testing.F) {
	f.Add("query=up&start=0&end=0&step=0&lookback=0")
	f.Add("query=sum(x)&start=1000&end=2000&step=15&lookback=60000")
	f.Add("query=&start=a&end=-1&step=-5")
	f.Fuzz(func(t *testing.T, form string) {
		v, err := url.ParseQuery(form)
		if err != nil {
			return
		}
		req, err := DecodeRequest(v)
		if err != nil {
			return
		}
		back, err := DecodeRequest(EncodeRequest(req))
		require.NoError(t, err)
		require.Equal(t, req, back)
	})
}
