package receive

import (
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"

	"github.com/phonehome/phonehome/limits"
)

// batch is one decoded request in the shape write() admits and stores.
//
// Remote-write 2.0 series are converted to prompb.TimeSeries (labels
// resolved from the symbol table, samples and histograms copied one for
// one, exemplars with their labels), so validation, _id binding, the
// allowlist and the limits run through the same admit() for both versions.
// The conversion is 1:1 per sample, histogram and exemplar, so the counts
// storage reports, and the written-count headers, stay exact. Start
// timestamps are accepted (0 means unset) but not stored: the TSDB appender
// used has no place for them.
type batch struct {
	series []prompb.TimeSeries
	// familyMeta is the metadata of a 1.0 request (per metric family).
	familyMeta []prompb.MetricMetadata
	// meta is nil (1.0) or holds each series' metadata (the zero value for none).
	meta []metadata.Metadata
	// invalid is nil or holds, per series, why decoding refused it; such a
	// series is an empty placeholder in series.
	invalid []invalidSeries
}

// invalidSeries is a series refused while decoding, with the samples and
// histograms it carried.
type invalidSeries struct {
	serr    *seriesError
	samples int
}

func (b *batch) samples() int {
	n := 0
	for i := range b.series {
		n += len(b.series[i].Samples) + len(b.series[i].Histograms)
	}
	for _, inv := range b.invalid {
		n += inv.samples
	}
	return n
}

// decodeV2 unmarshals a remote-write 2.0 request and checks the request-wide
// rule: a request with series has a symbol table whose first symbol is "".
// Per-series rules are checked by convertV2, so one bad series does not
// refuse the others.
func decodeV2(raw []byte) (*writev2.Request, error) {
	var req writev2.Request
	if err := req.Unmarshal(raw); err != nil {
		return nil, fmt.Errorf("protobuf decode: %w: %w", errBadRequest, err)
	}
	if len(req.Timeseries) > 0 || len(req.Symbols) > 0 {
		if len(req.Symbols) == 0 || req.Symbols[0] != "" {
			return nil, fmt.Errorf("symbols[0] must be the empty string: %w", errBadRequest)
		}
	}
	return &req, nil
}

// convertV2 converts a 2.0 request into a batch, checking each series: every
// symbol reference in range (labels, metadata, exemplars), labels_refs of
// even length, and samples or histograms but not both. Labels are sorted by
// name (ToLabels); duplicates are left for validateSeries to refuse. The
// batch references req's strings; samples, labels and exemplars share a few
// per-request backing arrays.
//
// Labels are checked against the tenant's label limits *before* they are
// built: a 2.0 label is a pair of references, so a tiny request could
// otherwise reference one large symbol thousands of times and expand to
// gigabytes. Over the whole request, built labels may not exceed
// labelBudgetFactor times max_decoded_bytes (errTooLarge, 413).
func convertV2(req *writev2.Request, lim *limits.TenantLimits) (*batch, error) {
	n := len(req.Timeseries)
	b := &batch{
		series:  make([]prompb.TimeSeries, n),
		meta:    make([]metadata.Metadata, n),
		invalid: make([]invalidSeries, n),
	}
	nLabels, nSamples := 0, 0
	for i := range req.Timeseries {
		pairs := len(req.Timeseries[i].LabelsRefs) / 2
		if !over(pairs, lim.MaxLabelNamesPerSeries) {
			nLabels += pairs + 1 // +1: room for an added _id
		}
		nSamples += len(req.Timeseries[i].Samples)
	}
	budget := labelBudgetFactor * lim.MaxDecodedBytes
	labelArena := make([]prompb.Label, 0, nLabels)
	sampleArena := make([]prompb.Sample, 0, nSamples)
	for i := range req.Timeseries {
		ts := &req.Timeseries[i]
		start := len(labelArena)
		refuse := func(format string, args ...any) {
			labelArena = labelArena[:start] // drop the labels of a refused series
			b.invalid[i] = invalidSeries{
				serr:    &seriesError{reasonInvalidSeries, fmt.Sprintf(format, args...)},
				samples: len(ts.Samples) + len(ts.Histograms),
			}
		}
		if len(ts.Samples) > 0 && len(ts.Histograms) > 0 {
			refuse("series has both samples and histograms")
			continue
		}
		size, serr := checkRefs(ts.LabelsRefs, req.Symbols, lim)
		for j := 0; serr == nil && j < len(ts.Exemplars); j++ {
			var n int64
			n, serr = checkRefs(ts.Exemplars[j].LabelsRefs, req.Symbols, lim)
			size += n
		}
		if serr != nil {
			b.invalid[i] = invalidSeries{serr: serr, samples: len(ts.Samples) + len(ts.Histograms)}
			continue
		}
		if budget -= size; budget < 0 {
			return nil, fmt.Errorf("labels of the request expand beyond %d bytes: %w", labelBudgetFactor*lim.MaxDecodedBytes, errTooLarge)
		}
		var err error
		labelArena, err = appendSymbolLabels(labelArena, ts.LabelsRefs, req.Symbols)
		if err != nil {
			refuse("labels: %v", err)
			continue
		}
		m, err := ts.ToMetadata(req.Symbols)
		if err != nil {
			refuse("%v", err)
			continue
		}
		exemplars, err := convertExemplars(ts.Exemplars, req.Symbols)
		if err != nil {
			refuse("exemplar: %v", err)
			continue
		}

		// The full slice expression makes an added _id reallocate instead of
		// overwriting the next series' labels.
		out := &b.series[i]
		out.Labels = labelArena[start:len(labelArena):len(labelArena)]
		if len(ts.Samples) > 0 {
			first := len(sampleArena)
			for _, s := range ts.Samples {
				sampleArena = append(sampleArena, prompb.Sample{Value: s.Value, Timestamp: s.Timestamp})
			}
			out.Samples = sampleArena[first:len(sampleArena):len(sampleArena)]
		}
		if len(ts.Histograms) > 0 {
			out.Histograms = make([]prompb.Histogram, len(ts.Histograms))
			for j, h := range ts.Histograms {
				if h.IsFloatHistogram() {
					out.Histograms[j] = prompb.FromFloatHistogram(h.Timestamp, h.ToFloatHistogram())
				} else {
					out.Histograms[j] = prompb.FromIntHistogram(h.Timestamp, h.ToIntHistogram())
				}
			}
		}
		out.Exemplars = exemplars
		b.meta[i] = m
	}
	return b, nil
}

// appendSymbolLabels appends the labels refs name in symbols to dst, sorted by
// name, as writev2's ToLabels would build them, but without a labels.Labels
// (one allocation per series) in between; the strings are the symbols'.
func appendSymbolLabels(dst []prompb.Label, refs []uint32, symbols []string) ([]prompb.Label, error) {
	if len(refs)%2 != 0 {
		return dst, fmt.Errorf("invalid labelRefs length %d", len(refs))
	}
	start := len(dst)
	for j := 0; j < len(refs); j += 2 {
		name, value := refs[j], refs[j+1]
		if int(name) >= len(symbols) || int(value) >= len(symbols) {
			return dst, fmt.Errorf("labelRefs %d (name) = %d (value) outside of symbols table (size %d)", name, value, len(symbols))
		}
		dst = append(dst, prompb.Label{Name: symbols[name], Value: symbols[value]})
	}
	ls := dst[start:]
	if !slices.IsSortedFunc(ls, compareLabelNames) {
		slices.SortFunc(ls, compareLabelNames)
	}
	return dst, nil
}

func compareLabelNames(a, b prompb.Label) int { return strings.Compare(a.Name, b.Name) }

// labelBudgetFactor bounds the labels a 2.0 request may expand to, as a
// multiple of max_decoded_bytes.
const labelBudgetFactor = 4

// checkRefs checks the label references of a series (or exemplar) against the
// label limits without building anything, and returns the bytes the labels
// would take. Out-of-range references are left for ToLabels to report.
func checkRefs(refs []uint32, symbols []string, lim *limits.TenantLimits) (int64, *seriesError) {
	if over(len(refs)/2, lim.MaxLabelNamesPerSeries) {
		return 0, &seriesError{reasonLabelLimits, fmt.Sprintf("series has %d labels, the limit is %d", len(refs)/2, lim.MaxLabelNamesPerSeries)}
	}
	var size int64
	for j := 0; j+1 < len(refs); j += 2 {
		if int(refs[j]) >= len(symbols) || int(refs[j+1]) >= len(symbols) {
			continue
		}
		name, value := symbols[refs[j]], symbols[refs[j+1]]
		if over(len(name), lim.MaxLabelNameLength) {
			return 0, &seriesError{reasonLabelLimits, fmt.Sprintf("label name of %d bytes, the limit is %d", len(name), lim.MaxLabelNameLength)}
		}
		if over(len(value), lim.MaxLabelValueLength) {
			return 0, &seriesError{reasonLabelLimits, fmt.Sprintf("value of label %q has %d bytes, the limit is %d", name, len(value), lim.MaxLabelValueLength)}
		}
		size += int64(len(name) + len(value))
	}
	return size, nil
}

// convertExemplars converts exemplars the way the series' labels are, with
// no labels.Labels in between (which, built with the dedupelabels tag, would
// need a symbol table per request).
func convertExemplars(in []writev2.Exemplar, symbols []string) ([]prompb.Exemplar, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]prompb.Exemplar, len(in))
	for i, e := range in {
		ls, err := appendSymbolLabels(nil, e.LabelsRefs, symbols)
		if err != nil {
			return nil, err
		}
		out[i] = prompb.Exemplar{Labels: ls, Value: e.Value, Timestamp: e.Timestamp}
	}
	return out, nil
}
