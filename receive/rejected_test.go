package receive

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// The answer to a refused write says whether the rest was written, and
// ends with the reasons, not with "bad request". The status stays 400.
func TestRejectedWriteWording(t *testing.T) {
	acme := &auth.Identity{Tenant: "acme"}
	outOfOrder := series("up", "job", "c")
	outOfOrder.Samples = []prompb.Sample{{Value: 13, Timestamp: 2000}} // fakeWriter refuses 13
	for _, tc := range []struct {
		name   string
		series []prompb.TimeSeries
		want   string
	}{
		{"all refused", []prompb.TimeSeries{series("1bad")},
			`1 of 1 samples rejected, nothing was written: series 0: invalid metric name "1bad"`},
		{"some refused", []prompb.TimeSeries{series("1bad"), series("up", "job", "b")},
			`1 of 2 samples rejected, the rest were written: series 0: invalid metric name "1bad"`},
		{"all refused by storage", []prompb.TimeSeries{outOfOrder},
			"1 of 1 samples rejected, nothing was written: 1 samples rejected: out of order sample"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHandler(discard(), nil, &fakeWriter{}, newLimiter(nil), Options{})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, newRequest(encode(t, tc.series...), acme))
			require.Equal(t, http.StatusBadRequest, rec.Code)
			require.Equal(t, tc.want+"\n", rec.Body.String())
		})
	}
}
