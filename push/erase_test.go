package push

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
)

// An erasure drops a cluster's aggregated series for good: not flushed
// again, not brought back by a restart's replay; the other cluster's stay.
func TestEraseDropsAClustersSeries(t *testing.T) {
	f := newFixture(t, testConfig())
	for _, tok := range []string{"tok-c1", "tok-c2", "tok-c1"} {
		code, body, _ := f.push(http.MethodPost, "/metrics/job/installer", tok, "", counterText)
		require.Equal(t, http.StatusOK, code, body)
	}
	require.Len(t, f.state("acme"), 4)

	n, err := f.gw.Erase("acme", []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", "c1")})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	f.w.values = nil
	want := map[string]float64{
		`{__name__="installs_total", _id="c2", job="installer", platform="aws", result="ok"}`:   1,
		`{__name__="installs_total", _id="c2", job="installer", platform="gcp", result="fail"}`: 2,
	}
	require.Equal(t, want, f.state("acme"))

	f.reopen() // a crash: the snapshot, not the log, is the truth
	require.Equal(t, want, f.state("acme"), "the push log no longer holds c1's pushes")

	n, err = f.gw.Erase("acme", []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", "c1")})
	require.NoError(t, err)
	require.Zero(t, n, "idempotent")
}

// A denied (erased) cluster's pushes are refused, so the state does not
// aggregate its data again.
func TestPushRefusesADeniedCluster(t *testing.T) {
	f := newFixture(t, testConfig())
	f.close()
	f.denied = func(tenant, cluster string) bool { return tenant == "acme" && cluster == "c1" }
	f.open()
	code, body, _ := f.push(http.MethodPost, "/metrics/job/installer", "tok-c1", "", counterText)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "erased")
	require.Contains(t, body, "POST /api/v1/admin/readmit", "says how the refusal is lifted")
	code, body, _ = f.push(http.MethodPost, "/metrics/job/installer", "tok-c2", "", counterText)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, f.state("acme"), 2)
	require.InDelta(t, 1, testutil.ToFloat64(f.gw.metrics.rejected.WithLabelValues(reasonErased)), 0)
}

// TestEraseDropsTheClusterFromTheEvictionBookkeeping: the eviction order and
// the list of series pushed once hold labels, _id included, until the next
// flush; an erasure must not leave the cluster's there.
func TestEraseDropsTheClusterFromTheEvictionBookkeeping(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = 3
	f := newFixture(t, cfg)
	push := func(tok, ls string) {
		t.Helper()
		code, body, _ := f.push(http.MethodPost, "/metrics/job/i", tok, "", counterPush(ls))
		require.Equal(t, http.StatusOK, code, body)
	}
	push("tok-c1", `a="1"`)
	push("tok-c1", `a="2"`)
	f.state("acme")         // both flushed: evictable
	push("tok-c1", `a="3"`) // pushed once, unflushed: fresh
	push("tok-c2", `b="1"`) // the budget is full: the order is built, a="1" evicted

	f.gw.mu.Lock()
	st := f.gw.state["acme"]
	require.NotNil(t, st.evict, "the order was built")
	require.NotEmpty(t, st.fresh)
	f.gw.mu.Unlock()

	_, err := f.gw.Erase("acme", []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", "c1")})
	require.NoError(t, err)
	f.gw.mu.Lock()
	defer f.gw.mu.Unlock()
	require.Nil(t, st.evict)
	for _, fr := range st.fresh {
		require.NotEqual(t, "c1", fr.it.Labels.Get("_id"))
	}
}
