package receive

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/storage/remote"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

// TestTelemeterWriteRateLimitIsRetriedByPrometheus: Prometheus drops a
// remote-write batch answered 429 ("non-recoverable") unless its
// remote_write sets retry_on_http_429, and cluster-monitoring-operator's
// telemetry remote_write does not; it retries 5xx, honouring Retry-After.
// So a cluster over its rate on /metrics/v1/receive must get a 503 with
// Retry-After, which Prometheus' own client takes as recoverable, or the
// batch is lost.
func TestTelemeterWriteRateLimitIsRetriedByPrometheus(t *testing.T) {
	lim := newLimiter(func(s *limits.Spec) { s.SamplesPerSecondPerCluster, s.BurstPerCluster = ptr(0.001), ptr(2) })
	h := NewHandler(discard(), nil, &fakeWriter{}, lim, Options{})
	id := auth.Identity{Tenant: "acme", ClusterID: "c1"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(auth.WithIdentity(r.Context(), id))
		if r.URL.Path == "/metrics/v1/receive" {
			h.ServeTelemeterWrite(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	store := func(path string) error {
		u, err := url.Parse(srv.URL + path)
		require.NoError(t, err)
		c, err := remote.NewWriteClient("telemetry", &remote.ClientConfig{ // as CMO renders it: no retry_on_http_429
			URL: &config_util.URL{URL: u}, Timeout: model.Duration(10 * time.Second),
		})
		require.NoError(t, err)
		_, err = c.Store(context.Background(), encode(t, series("a"), series("b")), 0)
		return err
	}
	require.NoError(t, store("/metrics/v1/receive"), "within the burst")

	err := store("/metrics/v1/receive")
	var rec remote.RecoverableError
	require.ErrorAs(t, err, &rec, "over the rate: Prometheus must retry, not drop (%v)", err)
	require.ErrorContains(t, err, "503")

	rr := httptest.NewRecorder()
	h.ServeTelemeterWrite(rr, newRequest(encode(t, series("a")), &id))
	require.Equal(t, http.StatusServiceUnavailable, rr.Code)
	require.NotEmpty(t, rr.Header().Get("Retry-After"), "Prometheus waits as long as the limit asks")

	err = store("/api/v1/write")
	require.ErrorContains(t, err, "429", "/api/v1/write keeps the remote-write spec's 429")
	require.False(t, errors.As(err, &rec))
}
