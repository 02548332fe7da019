package peers

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/query"
)

// A match[] too large for a URL (a Grafana variable over many clusters):
// label names and series are asked in a POST form, label values (GET
// only) over remote read instead; either way nothing is missing.
func TestIndexCallsWithAMatcherBeyondTheURLLimit(t *testing.T) {
	f := newFixture(t)
	b, bReads := serveCounted(t, f.set(t, nil, f.config()), tenantDBs{"acme": openSeries(t, csv("b-op", "c2"))}, nil)
	a := f.set(t, prometheus.NewRegistry(), f.config(host(b)))
	q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer q.Close()

	ids := []string{"c1", "c2"}
	for i := range 20_000 {
		ids = append(ids, "cluster-"+strconv.Itoa(i)+strings.Repeat("x", 50))
	}
	large := labels.MustNewMatcher(labels.MatchRegexp, "_id", strings.Join(ids, "|"))
	require.Greater(t, len(large.Value), 1<<20, "beyond Go's server limit of the request line and headers")

	series, ws, err := seriesOf(q, 0, 10_000, 0, large)
	require.NoError(t, err)
	require.Empty(t, ws)
	require.Equal(t, []string{`{__name__="csv_succeeded", _id="c1", name="a-op"}`, `{__name__="csv_succeeded", _id="c2", name="b-op"}`}, series)
	names, ws, err := q.LabelNames(context.Background(), nil, large)
	require.NoError(t, err)
	require.Empty(t, ws)
	require.Equal(t, []string{"__name__", "_id", "name"}, names)
	require.Zero(t, bReads.Load(), "both from the peer's index")
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callSeries, "labels")))
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "labels")))

	vals, ws, err := q.LabelValues(context.Background(), "name", nil, large)
	require.NoError(t, err)
	require.Empty(t, ws)
	require.Equal(t, []string{"a-op", "b-op"}, vals)
	require.Equal(t, int64(1), bReads.Load(), "label values over remote read")
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "series")))
	require.Zero(t, testutil.ToFloat64(a.m.reads.WithLabelValues("error")))
}

// An index answer beyond maxAPIAnswer is a warning, as a peer that cannot
// answer: remote read would read at least as much, with no bound at all.
func TestIndexAnswerOverTheCapIsAWarning(t *testing.T) {
	f := newFixture(t)
	peer := f.set(t, nil, f.config())
	h, reads := replicaHandler(peer, tenantDBs{"acme": openSeries(t, csv("b-op", "c2"))}, nil)
	huge := peer.WithInstance(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(ScopeHeader, ScopeLocal) // a current peer's local answer
		// Larger than any peer may answer, and saying so (a chunked one
		// is cut while it streams: TestAnswerIsCutAtTheCap).
		w.Header().Set("Content-Length", strconv.Itoa(maxAPIAnswer+1))
		_, _ = io.WriteString(w, `{"status":"success","data":[`)
		pad := strings.Repeat(" ", 1<<20)
		for range maxAPIAnswer >> 20 {
			if _, err := io.WriteString(w, pad); err != nil {
				return
			}
		}
	}))
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.Handle(query.SeriesPath, huge)
	mux.Handle(query.LabelNamesPath, huge)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	a := f.set(t, prometheus.NewRegistry(), f.config(host(srv)))
	q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer q.Close()
	series, ws, err := seriesOf(q, 0, 10_000, 0, labels.MustNewMatcher(labels.MatchEqual, "__name__", "csv_succeeded"))
	require.NoError(t, err)
	require.Len(t, ws, 1)
	require.Equal(t, []string{`{__name__="csv_succeeded", _id="c1", name="a-op"}`}, series, "this replica's only")
	names, ws, err := q.LabelNames(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, ws, 1)
	require.Equal(t, []string{"__name__", "_id", "name"}, names)
	require.Zero(t, reads.Load(), "no remote read")
	require.Zero(t, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callSeries, "series")))
	require.Zero(t, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "series")))
	require.Equal(t, 2.0, testutil.ToFloat64(a.m.reads.WithLabelValues("error")))
}

// A receiver of an earlier release, read with a tenant token
// (tenant_token_files), answers the index paths from its query API: its
// fleet view, not its own, so that the fleet would fan out again under
// every peer. Such an answer (no ScopeHeader: local) is not taken: the call
// reads the peer's series instead.
func TestAnEarlierReleasesFleetAnswerIsNotAnIndexAnswer(t *testing.T) {
	f := newFixture(t)
	own := tenantDBs{"acme": openSeries(t, csv("b-op", "c2"))}
	fleet := tenantDBs{"acme": openSeries(t, csv("b-op", "c2"), csv("fleet-op", "c7"))} // its peers' too
	old := f.set(t, nil, f.config())
	mux := http.NewServeMux()
	mux.Handle("POST /api/v1/read", auth.Middleware(old.Authenticator(tokens{}), auth.PermRead, nil,
		old.Handler(discard, nil, fleet, own, nil, query.ReadOptions{})))
	mux.Handle("/api/v1/", auth.Middleware(tokens{}, auth.PermRead, nil, query.NewHandler(discard, nil, fleet, query.Options{})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	tokenFile := filepath.Join(f.dir, "acme-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("acme-read\n"), 0o600))
	cfg := f.config(host(srv))
	cfg.TenantTokenFiles = map[string]string{"acme": tokenFile}
	a := f.set(t, prometheus.NewRegistry(), cfg)
	q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer q.Close()

	csvOnly := labels.MustNewMatcher(labels.MatchEqual, "__name__", "csv_succeeded")
	series, ws, err := seriesOf(q, 0, 10_000, 0, csvOnly)
	require.NoError(t, err)
	require.Empty(t, ws)
	require.Equal(t, []string{`{__name__="csv_succeeded", _id="c1", name="a-op"}`, `{__name__="csv_succeeded", _id="c2", name="b-op"}`}, series)
	vals, ws, err := q.LabelValues(context.Background(), "name", nil, csvOnly)
	require.NoError(t, err)
	require.Empty(t, ws)
	require.Equal(t, []string{"a-op", "b-op"}, vals)
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callSeries, "series")))
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "series")))
	require.Zero(t, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callSeries, "labels")))
	require.Zero(t, testutil.ToFloat64(a.m.labelCalls.WithLabelValues(callLabels, "labels")))
}

// An answer is read while it is decoded, never whole, and cut at the cap.
func TestAnswerIsCutAtTheCap(t *testing.T) {
	const answer = `{"status":"success","data":["a","b"],"warnings":["w"]}`
	decode := func(limit int64) ([]string, envelope, error) {
		var vals []string
		env, err := decodeEnvelope(json.NewDecoder(&cappedReader{r: strings.NewReader(answer), n: limit}),
			func(d *json.Decoder) error { return d.Decode(&vals) })
		return vals, env, err
	}
	vals, env, err := decode(int64(len(answer)))
	require.NoError(t, err, "exactly at the cap")
	require.Equal(t, []string{"a", "b"}, vals)
	require.Equal(t, envelope{Status: "success", Warnings: []string{"w"}}, env)
	_, _, err = decode(int64(len(answer)) - 1)
	require.ErrorIs(t, err, errAnswerTooLarge)
}

// A peer (or a proxy before it) that redirects an index call is not
// followed: a POST followed as a GET would lose its form and answer for
// every series, and the replica credential would go to another host.
func TestIndexCallsFollowNoRedirect(t *testing.T) {
	f := newFixture(t)
	var followed atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc(query.LabelNamesPath, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, _ *http.Request) {
		followed.Add(1)
		w.Header().Set(ScopeHeader, ScopeLocal)
		_, _ = io.WriteString(w, `{"status":"success","data":["__name__","everything"]}`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	a := f.set(t, prometheus.NewRegistry(), f.config(host(srv)))
	q, err := a.NewReader(tenantDBs{"acme": openSeries(t, csv("a-op", "c1"))}).Querier("acme", 0, 10_000)
	require.NoError(t, err)
	defer q.Close()
	names, ws, err := q.LabelNames(context.Background(), nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "nothing"))
	require.NoError(t, err)
	require.Len(t, ws, 1, "the peer's answer is missing, and said so")
	require.Empty(t, names)
	require.Zero(t, followed.Load())
}
