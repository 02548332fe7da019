package forward

import (
	"time"

	dto "github.com/prometheus/client_model/go"
)

// DefaultTelemeterMaxAge is how old a sample telemeter-server takes on
// /upload (its Validate is given 24h); telemeter-client drops older ones
// before it sends.
const DefaultTelemeterMaxAge = 24 * time.Hour

// maxTelemeterLength is the longest metric name, label name and label value
// telemeter-server takes, in bytes.
const maxTelemeterLength = 255

// dropRefused removes from families the metrics that telemeter-server
// refuses, as telemeter-client's NewDropInvalidFederateSamples does before
// it uploads: a metric name, label name or label value longer than 255
// bytes, or a sample older than minTS (ms). The server refuses the whole
// upload for any one of them, with 400 for an old sample (the batch would be
// dropped, fresh samples with it) and 500 for a long name or value (the
// batch would be retried for ever, holding up the queue behind it). It
// returns the families left and how many metrics it removed.
func dropRefused(families []*dto.MetricFamily, minTS int64) ([]*dto.MetricFamily, int) {
	dropped := 0
	out := families[:0]
	for _, mf := range families {
		if len(mf.GetName()) > maxTelemeterLength {
			dropped += len(mf.Metric)
			continue
		}
		kept := mf.Metric[:0]
		for _, m := range mf.Metric {
			if m.GetTimestampMs() < minTS || !labelsFit(m.Label) {
				dropped++
				continue
			}
			kept = append(kept, m)
		}
		clear(mf.Metric[len(kept):])
		mf.Metric = kept
		if len(kept) > 0 {
			out = append(out, mf)
		}
	}
	clear(families[len(out):])
	return out, dropped
}

func labelsFit(pairs []*dto.LabelPair) bool {
	for _, l := range pairs {
		if len(l.GetName()) > maxTelemeterLength || len(l.GetValue()) > maxTelemeterLength {
			return false
		}
	}
	return true
}
