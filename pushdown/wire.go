package pushdown

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/promql"
)

// The peer query protocol: a form POST of a Request, answered with a
// snappy-compressed remote-read ReadResponse of two results (the series,
// then one series per cluster key: the cluster label alone, empty for
// series without it) and the annotations in headers.
const (
	// Path is where a receiver serves its local data's part of a query.
	Path = "/api/v1/pushdown/query"
	// WarningHeader and InfoHeader carry the evaluation's annotations, one
	// per header line.
	WarningHeader = "X-Phonehome-Warning"
	InfoHeader    = "X-Phonehome-Info"
	// maxAnnotations bounds each kind in a response's headers.
	maxAnnotations = 10
	// maxResponse bounds a decoded response.
	maxResponse = 256 << 20
)

// EncodeRequest is the form of req.
func EncodeRequest(req Request) url.Values {
	return url.Values{
		"query": {req.Query},
		"start": {strconv.FormatInt(req.Start.UnixMilli(), 10)},
		"end":   {strconv.FormatInt(req.End.UnixMilli(), 10)},
		"step":  {strconv.FormatInt(req.Step.Milliseconds(), 10)},
		// lookback: milliseconds, 0 for the engine's default.
		"lookback": {strconv.FormatInt(req.Lookback.Milliseconds(), 10)},
	}
}

// DecodeRequest parses a form made by EncodeRequest.
func DecodeRequest(form url.Values) (Request, error) {
	var ms [4]int64
	for i, k := range []string{"start", "end", "step", "lookback"} {
		v, err := strconv.ParseInt(form.Get(k), 10, 64)
		if err != nil {
			return Request{}, fmt.Errorf("%s: want milliseconds: %w", k, err)
		}
		ms[i] = v
	}
	req := Request{Query: form.Get("query"), Start: time.UnixMilli(ms[0]), End: time.UnixMilli(ms[1]), Step: time.Duration(ms[2]) * time.Millisecond, Lookback: time.Duration(ms[3]) * time.Millisecond}
	switch {
	case req.Query == "":
		return Request{}, errors.New("query is empty")
	case req.Step < 0 || req.Lookback < 0 || req.End.Before(req.Start):
		return Request{}, errors.New("want 0 <= step, 0 <= lookback and start <= end")
	case req.Step == 0 && !req.End.Equal(req.Start):
		return Request{}, errors.New("an instant query (step 0) has start = end")
	}
	return req, nil
}

// writeResult answers with r.
func writeResult(w http.ResponseWriter, r *Result) error {
	series := make([]prompb.TimeSeries, 0, len(r.Series))
	for _, s := range r.Series {
		ts := prompb.TimeSeries{Labels: prompb.FromLabels(s.Metric, nil)}
		for _, p := range s.Floats {
			ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: p.T, Value: p.F})
		}
		for _, p := range s.Histograms {
			ts.Histograms = append(ts.Histograms, prompb.FromFloatHistogram(p.T, p.H))
		}
		series = append(series, ts)
	}
	keys := make([]prompb.TimeSeries, 0, len(r.Keys))
	for _, k := range r.Keys {
		keys = append(keys, prompb.TimeSeries{Labels: []prompb.Label{{Name: "key", Value: k}}})
	}
	b, err := (&prompb.ReadResponse{Results: []*prompb.QueryResult{{Timeseries: ptrs(series)}, {Timeseries: ptrs(keys)}}}).Marshal()
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "application/x-protobuf")
	h.Set("Content-Encoding", "snappy")
	for i, a := range r.Warnings {
		if i < maxAnnotations {
			h.Add(WarningHeader, oneLine(a))
		}
	}
	for i, a := range r.Infos {
		if i < maxAnnotations {
			h.Add(InfoHeader, oneLine(a))
		}
	}
	_, err = w.Write(snappy.Encode(nil, b))
	return err
}

func ptrs[T any](s []T) []*T {
	out := make([]*T, len(s))
	for i := range s {
		out[i] = &s[i]
	}
	return out
}

func oneLine(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "\r", " "), "\n", " ") }

// ReadResult decodes a 200 answer of the peer query protocol.
func ReadResult(resp *http.Response) (*Result, error) {
	compressed, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, err
	}
	n, err := snappy.DecodedLen(compressed)
	if err != nil {
		return nil, fmt.Errorf("decode answer: %w", err)
	}
	if n > maxResponse {
		return nil, fmt.Errorf("answer of %d bytes exceeds %d", n, maxResponse)
	}
	b, err := snappy.Decode(nil, compressed)
	if err != nil {
		return nil, fmt.Errorf("decode answer: %w", err)
	}
	var rr prompb.ReadResponse
	if err := rr.Unmarshal(b); err != nil {
		return nil, fmt.Errorf("decode answer: %w", err)
	}
	if len(rr.Results) != 2 {
		return nil, fmt.Errorf("decode answer: %d results, want 2", len(rr.Results))
	}
	out := &Result{Warnings: resp.Header.Values(WarningHeader), Infos: resp.Header.Values(InfoHeader)}
	symbols := labels.NewSymbolTable()
	builder := labels.NewScratchBuilderWithSymbolTable(symbols, 0)
	for _, ts := range rr.Results[0].Timeseries {
		s := promql.Series{Metric: ts.ToLabels(&builder, nil)}
		for _, p := range ts.Samples {
			s.Floats = append(s.Floats, promql.FPoint{T: p.Timestamp, F: p.Value})
		}
		for _, h := range ts.Histograms {
			s.Histograms = append(s.Histograms, promql.HPoint{T: h.Timestamp, H: h.ToFloatHistogram()})
		}
		out.Series = append(out.Series, s)
	}
	for _, ts := range rr.Results[1].Timeseries {
		if len(ts.Labels) != 1 {
			return nil, errors.New("decode answer: a cluster key is not one label")
		}
		out.Keys = append(out.Keys, ts.Labels[0].Value)
	}
	return out, nil
}
