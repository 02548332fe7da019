package forward

import (
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/prometheus/prompb"
)

// The last cycle, as it left: what telemeter-client serves on /federate, so
// that an operator or a security reviewer can read exactly what this
// cluster sends (after the allowlist, relabeling and anonymization), not
// what its Prometheus holds.

// lastCycle is the requests of the last collection, as queued.
type lastCycle struct {
	records [][]byte // queue payloads (encodePayloadV2)
	at      time.Time
}

// LastCycleHandler serves the last collection's series in the Prometheus
// exposition format the client asks for (text by default), each sample
// with its timestamp; the response is empty before the first collection.
// Native histograms are left out (as telemeter uploads leave them out).
func (f *Forwarder) LastCycleHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		last := f.last.Load()
		format := expfmt.NegotiateAccept(r.Header, expfmt.DefaultAcceptedFormats()...)
		w.Header().Set("Content-Type", string(format))
		if last == nil {
			return
		}
		w.Header().Set("Last-Modified", last.at.UTC().Format(http.TimeFormat))
		var all prompb.WriteRequest // one family per name across the cycle's requests
		for _, p := range last.records {
			req, err := decodePayloadV1(p)
			if err != nil {
				f.logger.Error("decode the last cycle for /federate", "err", err)
				http.Error(w, "the last cycle cannot be decoded", http.StatusInternalServerError)
				return
			}
			all.Timeseries = append(all.Timeseries, req.Timeseries...)
		}
		fams, _ := TelemeterFamilies(&all, nil)
		enc := expfmt.NewEncoder(w, format)
		for _, mf := range fams {
			if err := enc.Encode(mf); err != nil {
				return // the client went away
			}
		}
	})
}

func decodePayloadV1(p []byte) (*prompb.WriteRequest, error) {
	rec, err := decodePayload(p)
	if err != nil {
		return nil, err
	}
	return rec.toV1()
}
