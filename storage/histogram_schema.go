package storage

import (
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/prompb"
)

// toHistograms converts h for TSDB. Schemas 9 to 52 are reserved for finer
// exponential buckets: Prometheus' receiver reduces them to 8, the finest
// TSDB stores, rather than refusing them (TSDB would: invalid schema). A
// reduction's error is a histogram.Error, refused as an invalid sample.
func toHistograms(h prompb.Histogram) (*histogram.Histogram, *histogram.FloatHistogram, error) {
	if h.IsFloatHistogram() {
		fh := h.ToFloatHistogram()
		if reservedFinerSchema(fh.Schema) {
			return nil, fh, fh.ReduceResolution(histogram.ExponentialSchemaMax)
		}
		return nil, fh, nil
	}
	ih := h.ToIntHistogram()
	if reservedFinerSchema(ih.Schema) {
		return ih, nil, ih.ReduceResolution(histogram.ExponentialSchemaMax)
	}
	return ih, nil, nil
}

func reservedFinerSchema(s int32) bool {
	return s > histogram.ExponentialSchemaMax && histogram.IsExponentialSchemaReserved(s)
}
