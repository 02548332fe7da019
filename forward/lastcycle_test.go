package forward

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// /federate serves what the last cycle queued, as it left: anonymized,
// allowlisted, renamed, with the samples' timestamps.
func TestLastCycleHandlerServesWhatWasSent(t *testing.T) {
	prom := fakePrometheus(t, readFixture(t, "federate-sample.prom"), false)
	h := newHarness(t, prom.URL, newFakeReceiver(t), t.TempDir(), Options{MaxSamplesPerRequest: 50}, FederateOptions{})
	get := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.f.LastCycleHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/federate", nil))
		require.Equal(t, http.StatusOK, rec.Code)
		return rec
	}
	require.Empty(t, get().Body.String(), "nothing before the first cycle")

	require.NoError(t, h.f.Collect(context.Background()))
	rec := get()
	require.True(t, strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain"), rec.Header())
	require.NotEmpty(t, rec.Header().Get("Last-Modified"))
	body := rec.Body.Bytes()
	require.False(t, bytes.Contains(body, []byte(fixtureID)), "the raw id never leaves, and is not shown")
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	n := 0
	for name, mf := range fams {
		require.NotEqual(t, "ALERTS", name, "renamed as sent")
		for _, m := range mf.GetMetric() {
			n++
			require.Positive(t, m.GetTimestampMs(), "with the sample's timestamp")
			var id string
			for _, l := range m.GetLabel() {
				if l.GetName() == "_id" {
					id = l.GetValue()
				}
			}
			require.Equal(t, hashedID, id)
		}
	}
	require.Equal(t, 224, n, "every series of the cycle, across its 5 requests")
}
