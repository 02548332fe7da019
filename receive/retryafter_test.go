package receive

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

// TestRetryAfterIsTheWaitOfTheRefusedRequest: a cluster whose bucket a paid
// request emptied sends 300 samples at 1 sample/s. It must be told to come
// back in 300s, when they fit, not in 1s (when one sample fits), on each of
// the write paths, and again when it comes back early (refused before its
// body is read).
func TestRetryAfterIsTheWaitOfTheRefusedRequest(t *testing.T) {
	lim := newLimiter(func(s *limits.Spec) { s.SamplesPerSecondPerCluster = ptr(1.0) }) // burst: the default
	h := NewHandler(discard(), nil, &fakeWriter{}, lim, Options{})
	var fams []*dto.MetricFamily
	for i := range 300 {
		fams = append(fams, gauge(fmt.Sprintf("m_%03d", i), 1, 1000, "job", "a"))
	}
	upload := framed(t, delimited(t, fams...))
	for _, tc := range []struct {
		path  string
		serve func(http.ResponseWriter, *http.Request)
		req   func(id *auth.Identity) *http.Request
		code  int
		cost  int // samples the request is charged: an upload's metadata costs one more
	}{
		{"/upload", h.ServeUpload, func(id *auth.Identity) *http.Request { return uploadRequest(upload, id) }, http.StatusTooManyRequests, 301},
		{"/api/v1/write", h.ServeHTTP, func(id *auth.Identity) *http.Request {
			return newRequest(encode(t, manySeries(id.ClusterID, 0, 300)...), id)
		}, http.StatusTooManyRequests, 300},
		{"/metrics/v1/receive", h.ServeTelemeterWrite, func(id *auth.Identity) *http.Request {
			return newRequest(encode(t, manySeries(id.ClusterID, 0, 300)...), id)
		}, http.StatusServiceUnavailable, 300},
	} {
		t.Run(tc.path, func(t *testing.T) {
			id := &auth.Identity{Tenant: "acme", ClusterID: "c" + tc.path}
			_, err := lim.AllowSamples(id.Tenant, id.ClusterID, lim.For(id.Tenant).BurstPerCluster)
			require.NoError(t, err, "a paid request empties the bucket")
			for _, try := range []string{"decoded and refused", "back early: refused before its body"} {
				rec := httptest.NewRecorder()
				tc.serve(rec, tc.req(id))
				require.Equal(t, tc.code, rec.Code, "%s: %s", try, rec.Body)
				want := []string{strconv.Itoa(tc.cost), strconv.Itoa(tc.cost - 1)} // less, if a second went by
				require.Contains(t, want, rec.Header().Get("Retry-After"), "%s: until %d samples fit at 1/s", try, tc.cost)
			}
		})
	}
}
