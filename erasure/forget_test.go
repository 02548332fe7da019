package erasure

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/status"
	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/lifecycle"
)

// clusterIDs lists the clusters the status API shows for acme.
func clusterIDs(t *testing.T, st *status.Status) []string {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/api/v1/status/clusters", nil)
	r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: "acme", Allow: auth.PermRead}))
	rec := httptest.NewRecorder()
	st.Handler().ServeHTTP(rec, r)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var body struct {
		Data struct {
			Clusters []struct {
				ID string `json:"id"`
			} `json:"clusters"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	var ids []string
	for _, c := range body.Data.Clusters {
		ids = append(ids, c.ID)
	}
	return ids
}

// writeSeries admits n series of cluster as the receiver does for a request.
func writeSeries(t *testing.T, l *limits.Limiter, cluster string, n int) {
	t.Helper()
	s := l.Session("acme", cluster)
	for i := range n {
		require.NoError(t, s.Admit("up", (uint64(len(cluster))<<20+uint64(i))*0x9e3779b97f4a7c15)) // distinct: an odd factor is a bijection
		s.Accept(1)
	}
	s.Done("prometheus.WriteRequest", "phonehome-forwarder")
}

// An erased cluster leaves the limiter: its series stop counting against
// the budgets and the status page no longer lists it.
func TestErasureForgetsTheClusterInTheLimiter(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := limits.New(reg, limits.Config{}, nil)
	l.TrackClusters([]string{"series_limit"})
	writeSeries(t, l, secretID, 224)
	writeSeries(t, l, "other", 3)
	st := status.New(slog.New(slog.DiscardHandler), nil, status.Options{Limiter: l})
	require.ElementsMatch(t, []string{secretID, "other"}, clusterIDs(t, st))
	tracked := func() float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "phonehome_limits_tracked_series" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no phonehome_limits_tracked_series")
		return 0
	}
	require.EqualValues(t, 227, tracked())

	// A write that passed the deny check just before the deny was taken
	// is admitted after the local step (bucket step, here): the end of the
	// job forgets it too.
	slipped := &hookBucket{before: func() {
		require.Equal(t, []string{"other"}, clusterIDs(t, st))
		writeSeries(t, l, secretID, 2)
	}}
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, slipped, t.TempDir(), Options{})
	require.NoError(t, err)
	e.SetLimiter(l)
	job, err := e.Submit(Request{Tenant: "acme", ClusterID: secretID})
	require.NoError(t, err)
	require.NoError(t, e.Do(context.Background(), job.ID))

	require.Equal(t, []string{"other"}, clusterIDs(t, st))
	require.EqualValues(t, 3, tracked())
	ts, _ := l.Tenant("acme")
	require.EqualValues(t, 3, ts.Series)
	got, _ := e.Get(job.ID)
	require.Empty(t, got.Warning)
}

// hookBucket runs before at the start of its bucket step.
type hookBucket struct {
	fakeBucket
	before func()
}

func (h *hookBucket) EraseBucket(ctx context.Context, tenant string, ms []*labels.Matcher, forbidden []string, dir string, progress func(int, int)) (lifecycle.BucketErasure, error) {
	h.before()
	return h.fakeBucket.EraseBucket(ctx, tenant, ms, forbidden, dir, progress)
}

// emptyLocal and emptyBucket hold nothing of any cluster.
type emptyLocal struct{ fakeLocal }

func (*emptyLocal) EraseLocal(context.Context, string, []*labels.Matcher, []string) (storage.LocalErasure, error) {
	return storage.LocalErasure{}, nil
}

type emptyBucket struct{}

func (emptyBucket) EraseBucket(context.Context, string, []*labels.Matcher, []string, string, func(int, int)) (lifecycle.BucketErasure, error) {
	return lifecycle.BucketErasure{}, nil
}

// An erasure that finds nothing (a mistyped _id) says so in its status
// and in a warning log line, and still denies the id: a cluster that has
// not written yet must stay out.
func TestErasureOfAnUnknownClusterWarns(t *testing.T) {
	l := limits.New(nil, limits.Config{}, nil)
	l.TrackClusters(nil)
	writeSeries(t, l, "known-but-not-stored", 1) // e.g. upstream-only: the limiter knew it

	for _, tc := range []struct {
		name    string
		req     Request
		warning string
	}{
		{"unknown cluster", Request{Tenant: "acme", ClusterID: "mistyped"}, "no series of this cluster were found on this replica or in the bucket: check the _id"},
		{"selector matching nothing", Request{Tenant: "acme", Selector: `{job="nope"}`}, "no series matched the selector on this replica or in the bucket: check the selector"},
		{"cluster only the limiter knew", Request{Tenant: "acme", ClusterID: "known-but-not-stored"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			local := &emptyLocal{}
			e, err := New(slog.New(slog.NewJSONHandler(&logs, nil)), nil, local, emptyBucket{}, t.TempDir(), Options{})
			require.NoError(t, err)
			e.SetLimiter(l)
			job, err := e.Submit(tc.req)
			require.NoError(t, err)
			require.NoError(t, e.Do(context.Background(), job.ID))
			got, _ := e.Get(job.ID)
			require.Equal(t, StateDone, got.State)
			require.Zero(t, got.SeriesRemoved)
			require.Equal(t, tc.warning, got.Warning)
			if tc.warning != "" {
				require.Contains(t, logs.String(), `"level":"WARN","msg":"erasure found nothing to erase"`)
			} else {
				require.NotContains(t, logs.String(), "WARN")
			}
			if tc.req.ClusterID != "" {
				require.Equal(t, []string{"acme " + tc.req.ClusterID}, local.denied)
				require.NotContains(t, logs.String(), tc.req.ClusterID)
			}
		})
	}
}
