package receive

import (
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"

	"github.com/phonehome/phonehome/limits"
)

// batch is one decoded request in the shape write() admits and stores.
//
// Remote-write 2.0 series are converted to prompb.TimeSeries (labels
// resolved from the symbol table, those of empty value left out as 1.0's are
// dropped, samples and histograms copied one for one, exemplars with their
// labels), so validation, _id binding, the allowlist and the limits run
// through the same admit() for both versions.
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
	// invalidMeta counts 2.0 metadata dropped for a help or unit over
	// maxHelpBytes or maxUnitBytes (the series' samples are kept).
	invalidMeta int
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

// v2Conversion holds convertV2's outputs (the batch and its slices) and the
// arenas its series point into, reused from one request to the next.
type v2Conversion struct {
	b       batch
	series  []prompb.TimeSeries
	meta    []metadata.Metadata
	invalid []invalidSeries
	labels  []prompb.Label
	samples []prompb.Sample
	// owned holds, by symbol reference, copies of the symbols storage keeps
	// as given (metadata, and the metric names of series with metadata);
	// "" where none was made yet. It has no elements until one is needed.
	owned []string
	// interned keeps those copies from one request to the next: a
	// forwarder sends its families' help texts and names with every
	// request. It is bounded (see intern) and dropped with the buffer.
	interned      map[string]string
	internedBytes int
}

// Bounds of v2Conversion.interned: symbols longer than maxInternedSymbol are
// copied for each request; beyond maxInterned entries or maxInternedBytes
// the map starts over.
const (
	maxInternedSymbol = 1 << 10
	maxInterned       = 1 << 12
	maxInternedBytes  = 256 << 10
)

// reset drops what the previous request left: slices are cleared to their
// length, so elements beyond it are always zero.
func (c *v2Conversion) reset() {
	clear(c.series)
	clear(c.meta)
	clear(c.invalid)
	clear(c.labels)
	clear(c.owned)
	c.series, c.meta, c.invalid = c.series[:0], c.meta[:0], c.invalid[:0]
	c.labels, c.samples, c.owned = c.labels[:0], c.samples[:0], c.owned[:0]
	c.b = batch{}
}

// own returns symbols[ref] as a string that does not alias the body: a copy
// made at most once per request, and usually by an earlier request (see
// interned). ref must be in range.
func (c *v2Conversion) own(symbols []string, ref uint32) string {
	s := symbols[ref]
	if s == "" {
		return ""
	}
	if len(c.owned) == 0 {
		c.owned = slices.Grow(c.owned, len(symbols))[:len(symbols)]
	}
	o := c.owned[ref]
	if o == "" {
		o = c.intern(s)
		c.owned[ref] = o
	}
	return o
}

// intern returns a copy of s, the same one for the same s as long as
// interned keeps it.
func (c *v2Conversion) intern(s string) string {
	if s == "" {
		return ""
	}
	if o, ok := c.interned[s]; ok {
		return o
	}
	o := strings.Clone(s)
	if len(o) > maxInternedSymbol {
		return o
	}
	if c.interned == nil || len(c.interned) >= maxInterned || c.internedBytes+len(o) > maxInternedBytes {
		c.interned, c.internedBytes = make(map[string]string), 0
	}
	c.interned[o] = o
	c.internedBytes += len(o)
	return o
}

// zeroLen returns s with length n, every element zero, reusing its array
// when it is large enough (elements beyond len(s) are zero, see reset).
func zeroLen[T any](s []T, n int) []T {
	clear(s)
	return slices.Grow(s[:0], n)[:n]
}

// convertV2 converts d's request into a batch, checking each series: every
// symbol reference in range (labels, metadata, exemplars), labels_refs of
// even length, and samples or histograms but not both. Labels keep the
// sender's order: validateSeries sorts (and counts) them as for 1.0, and
// refuses duplicates. A series' labels with an empty value are left out,
// as validateSeries drops them from a 1.0 series (see labelKind).
// The batch and the series' labels and samples live in d (d.conv) and are
// valid until d is reused; label strings alias the body like the symbols,
// except the metadata's and the metric name of a series with metadata, which
// storage keeps as given and so are copies. Histograms and exemplars, rare
// in telemetry, are allocated per request.
//
// Labels are checked against the tenant's label limits *before* they are
// built: a 2.0 label is a pair of references, so a tiny request could
// otherwise reference one large symbol thousands of times and expand to
// gigabytes. Over the whole request, built labels may not exceed
// labelBudgetFactor times max_decoded_bytes (errTooLarge, 413).
func convertV2(d *v2Request, lim *limits.TenantLimits) (*batch, error) {
	req, c := &d.req, &d.conv
	c.reset()
	n := len(req.Timeseries)
	c.series = zeroLen(c.series, n)
	c.meta = zeroLen(c.meta, n)
	c.invalid = zeroLen(c.invalid, n)
	c.b = batch{series: c.series, meta: c.meta, invalid: c.invalid}
	nLabels, nSamples, err := c.checkSeries(req, lim)
	if err != nil {
		return nil, err
	}
	// The prompb form costs more than the 2.0 form: a label is a 64-byte
	// struct where it was two varints.
	if err := d.exp.spend(labelCost*int64(nLabels) + sampleCost*int64(nSamples) + seriesCost*int64(n)); err != nil {
		return nil, err
	}
	// Sized so that appending never moves them: the series point into them.
	labelArena := slices.Grow(c.labels, nLabels)
	sampleArena := slices.Grow(c.samples, nSamples)
	defer func() { c.labels, c.samples = labelArena, sampleArena }()
	for i := range req.Timeseries {
		if c.invalid[i].serr != nil {
			continue
		}
		ts := &req.Timeseries[i]
		start := len(labelArena)
		refuse := func(format string, args ...any) {
			clear(labelArena[start:])
			labelArena = labelArena[:start] // drop the labels of a refused series
			c.invalid[i] = invalidSeries{
				serr:    &seriesError{reasonInvalidSeries, fmt.Sprintf(format, args...)},
				samples: len(ts.Samples) + len(ts.Histograms),
			}
		}
		labelArena, err = appendSymbolLabels(labelArena, ts.LabelsRefs, req.Symbols, seriesLabels)
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
		if len(m.Help) > maxHelpBytes || len(m.Unit) > maxUnitBytes {
			// As for 1.0: storage logs a series' metadata in the WAL,
			// so one large symbol referenced by every series of a
			// request would be written once per series.
			m = metadata.Metadata{}
			c.b.invalidMeta++
		}
		if keepsMetadata(m) {
			// Storage keeps metadata, and the metric name it files it
			// under, as given: copies, not the body's bytes.
			m.Help, m.Unit = c.own(req.Symbols, ts.Metadata.HelpRef), c.own(req.Symbols, ts.Metadata.UnitRef)
			c.ownMetricName(labelArena[start:])
		}

		// The spare element is room for an added _id; the full slice
		// expression keeps any further append from overwriting the next
		// series' labels.
		end := len(labelArena)
		labelArena = append(labelArena, prompb.Label{})
		out := &c.series[i]
		out.Labels = labelArena[start : end : end+1]
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
		c.meta[i] = m
	}
	return &c.b, nil
}

// checkSeries refuses (in c.invalid) the series of req that break a rule
// checked without building anything: samples and histograms both, or labels
// (the series' or an exemplar's) over the label limits. It returns the
// labels (with room for an added _id) and samples the other series will
// take once built, and errTooLarge when their labels pass the request's
// budget.
func (c *v2Conversion) checkSeries(req *writev2.Request, lim *limits.TenantLimits) (nLabels, nSamples int, err error) {
	budget := labelBudgetFactor * lim.MaxDecodedBytes
	for i := range req.Timeseries {
		ts := &req.Timeseries[i]
		var (
			kept int
			size int64
			serr *seriesError
		)
		if len(ts.Samples) > 0 && len(ts.Histograms) > 0 {
			serr = &seriesError{reasonInvalidSeries, "series has both samples and histograms"}
		} else {
			kept, size, serr = checkRefs(ts.LabelsRefs, req.Symbols, lim, seriesLabels)
		}
		for j := 0; serr == nil && j < len(ts.Exemplars); j++ {
			var n int64
			_, n, serr = checkRefs(ts.Exemplars[j].LabelsRefs, req.Symbols, lim, exemplarLabels)
			size += n
		}
		if serr != nil {
			c.invalid[i] = invalidSeries{serr: serr, samples: len(ts.Samples) + len(ts.Histograms)}
			continue
		}
		if budget -= size; budget < 0 {
			return 0, 0, fmt.Errorf("labels of the request expand beyond %d bytes: %w", labelBudgetFactor*lim.MaxDecodedBytes, errTooLarge)
		}
		nLabels += kept + 1 // +1: room for an added _id
		nSamples += len(ts.Samples)
	}
	return nLabels, nSamples, nil
}

// keepsMetadata reports whether storage keeps m (see storage's
// isZeroMetadata).
func keepsMetadata(m metadata.Metadata) bool {
	return (m.Type != "" && m.Type != model.MetricTypeUnknown) || m.Help != "" || m.Unit != ""
}

// ownMetricName replaces the value of the __name__ label in ls with a copy.
func (c *v2Conversion) ownMetricName(ls []prompb.Label) {
	for k := range ls {
		if ls[k].Name == model.MetricNameLabel {
			ls[k].Value = c.intern(ls[k].Value)
		}
	}
}

// labelKind says whose labels a list of references names. A series' leave
// out the labels with an empty value (absent, in Prometheus' data model), as
// validateSeries drops them from a 1.0 series: the same series sent in
// either version then counts the same against the limits, has the same key
// and _id, and is stored the same. An exemplar's are kept as sent, as a 1.0
// exemplar's are (and Prometheus keeps them).
type labelKind uint8

const (
	seriesLabels labelKind = iota
	exemplarLabels
)

// keeps reports whether a label with value is kept.
func (k labelKind) keeps(value string) bool { return value != "" || k == exemplarLabels }

// appendSymbolLabels appends the labels refs name in symbols to dst, in the
// sender's order, those kind keeps, without a labels.Labels (one allocation
// per series) in between; the strings are the symbols'. A series' labels are
// sorted, and counted when they were not, by validateSeries, as 1.0's are;
// exemplars' by convertExemplars.
func appendSymbolLabels(dst []prompb.Label, refs []uint32, symbols []string, kind labelKind) ([]prompb.Label, error) {
	if len(refs)%2 != 0 {
		return dst, fmt.Errorf("invalid labelRefs length %d", len(refs))
	}
	for j := 0; j < len(refs); j += 2 {
		name, value := refs[j], refs[j+1]
		if int(name) >= len(symbols) || int(value) >= len(symbols) {
			return dst, fmt.Errorf("labelRefs %d (name) = %d (value) outside of symbols table (size %d)", name, value, len(symbols))
		}
		if kind.keeps(symbols[value]) {
			dst = append(dst, prompb.Label{Name: symbols[name], Value: symbols[value]})
		}
	}
	return dst, nil
}

func compareLabelNames(a, b prompb.Label) int { return strings.Compare(a.Name, b.Name) }

// labelBudgetFactor bounds the labels a 2.0 request may expand to, as a
// multiple of max_decoded_bytes.
const labelBudgetFactor = 4

// checkRefs checks the labels that the references of a series (or
// exemplar) name and kind keeps against the label limits without building
// anything, in validateSeries' order (the count first), and returns how many
// labels and bytes they would take. Out-of-range references count as labels
// and are left for appendSymbolLabels to refuse.
func checkRefs(refs []uint32, symbols []string, lim *limits.TenantLimits, kind labelKind) (kept int, size int64, serr *seriesError) {
	var lengthErr *seriesError
	for j := 0; j+1 < len(refs); j += 2 {
		if int(refs[j]) >= len(symbols) || int(refs[j+1]) >= len(symbols) {
			kept++
			continue
		}
		name, value := symbols[refs[j]], symbols[refs[j+1]]
		if !kind.keeps(value) {
			continue
		}
		kept++
		switch {
		case lengthErr != nil:
		case over(len(name), lim.MaxLabelNameLength):
			lengthErr = &seriesError{reasonLabelLimits, fmt.Sprintf("label name of %d bytes, the limit is %d", len(name), lim.MaxLabelNameLength)}
		case over(len(value), lim.MaxLabelValueLength):
			lengthErr = &seriesError{reasonLabelLimits, fmt.Sprintf("value of label %q has %d bytes, the limit is %d", name, len(value), lim.MaxLabelValueLength)}
		}
		size += int64(len(name) + len(value))
	}
	if over(kept, lim.MaxLabelNamesPerSeries) {
		return 0, 0, &seriesError{reasonLabelLimits, fmt.Sprintf("series has %d labels, the limit is %d", kept, lim.MaxLabelNamesPerSeries)}
	}
	if lengthErr != nil {
		return 0, 0, lengthErr
	}
	return kept, size, nil
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
		ls, err := appendSymbolLabels(nil, e.LabelsRefs, symbols, exemplarLabels)
		if err != nil {
			return nil, err
		}
		if !slices.IsSortedFunc(ls, compareLabelNames) {
			slices.SortFunc(ls, compareLabelNames) // as writev2's ToLabels would
		}
		out[i] = prompb.Exemplar{Labels: ls, Value: e.Value, Timestamp: e.Timestamp}
	}
	return out, nil
}
