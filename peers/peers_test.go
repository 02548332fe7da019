package peers

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gogo/protobuf/proto"
	"github.com/golang/snappy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/promql"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/pushdown"
	"github.com/phonehome/phonehome/query"
	"github.com/phonehome/phonehome/webtls"
	"github.com/phonehome/phonehome/webtls/webtlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var discard = slog.New(slog.DiscardHandler)

// tenantDBs is a local reader over one in-test TSDB per tenant.
type tenantDBs map[string]*tsdb.DB

func (t tenantDBs) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	db, ok := t[tenant]
	if !ok {
		return promstorage.NoopQuerier(), nil
	}
	return db.Querier(mint, maxt)
}

// openDB holds, per series name, samples at the given timestamps (value = ts/1000).
func openDB(t *testing.T, series map[string][]int64) *tsdb.DB {
	t.Helper()
	db, err := tsdb.Open(t.TempDir(), nil, nil, tsdb.DefaultOptions(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	app := db.Appender(context.Background())
	for name, ts := range series {
		for _, ts := range ts {
			_, err := app.Append(0, labels.FromStrings("__name__", name, "_id", "c1"), ts, float64(ts)/1000)
			require.NoError(t, err)
		}
	}
	require.NoError(t, app.Commit())
	return db
}

// tokens authenticates "<tenant>-read" as a reader of tenant.
type tokens struct{}

func (tokens) Authenticate(r *http.Request) (auth.Identity, error) {
	tok, ok := auth.ParseBearer(r.Header.Get("Authorization"))
	if !ok || !strings.HasSuffix(tok, "-read") {
		return auth.Identity{}, auth.ErrUnauthorized
	}
	return auth.Identity{Tenant: strings.TrimSuffix(tok, "-read"), Allow: auth.PermRead}, nil
}

type fixture struct {
	dir    string
	client *http.Client
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{dir: t.TempDir(), client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
	t.Cleanup(f.client.CloseIdleConnections)
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "replica"), []byte("replica-secret\n"), 0o600))
	return f
}

func (f *fixture) config(endpoints ...string) Config {
	c := Config{Endpoints: endpoints, ReplicaTokenFile: filepath.Join(f.dir, "replica")}
	c.SetDefaults()
	return c
}

func (f *fixture) set(t *testing.T, reg prometheus.Registerer, cfg Config) *Set {
	t.Helper()
	require.NoError(t, cfg.Validate())
	s, err := New(discard, reg, cfg, Options{HTTPClient: f.client})
	require.NoError(t, err)
	return s
}

// serve runs a replica's remote-read endpoint (on every path) and index
// calls (label and series calls) over local with s's identity.
func serve(t *testing.T, s *Set, local tenantDBs, horizon func(string) int64) *httptest.Server {
	t.Helper()
	srv, _ := serveCounted(t, s, local, horizon)
	return srv
}

// serveCounted is serve, also returning the count of remote reads served.
func serveCounted(t *testing.T, s *Set, local tenantDBs, horizon func(string) int64) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	h, reads := replicaHandler(s, local, horizon)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, reads
}

// replicaHandler is what serveCounted serves.
func replicaHandler(s *Set, local tenantDBs, horizon func(string) int64) (http.Handler, *atomic.Int64) {
	var reads atomic.Int64
	read := s.Handler(discard, nil, local, local, horizon, query.ReadOptions{})
	indexCalls := auth.Middleware(s.Authenticator(tokens{}), auth.PermRead, nil,
		s.IndexHandler(discard, query.NewIndexHandler(discard, local, nil), local, nil))
	mux := http.NewServeMux()
	mux.Handle("/", auth.Middleware(s.Authenticator(tokens{}), auth.PermRead, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reads.Add(1)
		read.ServeHTTP(w, r)
	})))
	for _, p := range query.IndexPaths() {
		mux.Handle(p, indexCalls)
	}
	return mux, &reads
}

type sample struct {
	T int64
	V float64
}

func readAll(t *testing.T, q promstorage.Querier, ms ...*labels.Matcher) (map[string][]sample, []string) {
	t.Helper()
	defer func() { require.NoError(t, q.Close()) }()
	if len(ms) == 0 {
		ms = []*labels.Matcher{labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+")}
	}
	ss := q.Select(context.Background(), true, nil, ms...)
	out := map[string][]sample{}
	for ss.Next() {
		s := ss.At()
		it := s.Iterator(nil)
		for it.Next() != 0 {
			ts, v := it.At()
			out[s.Labels().String()] = append(out[s.Labels().String()], sample{ts, v})
		}
		require.NoError(t, it.Err())
	}
	require.NoError(t, ss.Err())
	var ws []string
	for _, w := range ss.Warnings() {
		ws = append(ws, w.Error())
	}
	return out, ws
}

func host(srv *httptest.Server) string { return strings.TrimPrefix(srv.URL, "http://") }

func TestFleetReadMergesPeersOnceAndIsPartialWhenOneIsDown(t *testing.T) {
	f := newFixture(t)
	peerB := f.set(t, nil, f.config())
	b := serve(t, peerB, tenantDBs{
		"acme":   openDB(t, map[string][]int64{"x": {2000, 3000}, "y": {1000}}),
		"globex": openDB(t, map[string][]int64{"secret": {1000}}),
	}, nil)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close() // connection refused

	reg := prometheus.NewRegistry()
	a := f.set(t, reg, f.config(host(b), host(down)))
	local := tenantDBs{"acme": openDB(t, map[string][]int64{"x": {1000, 2000}})}
	r := a.NewReader(local)

	q, err := r.Querier("acme", 0, 10_000)
	require.NoError(t, err)
	got, warnings := readAll(t, q)
	require.Equal(t, map[string][]sample{
		`{__name__="x", _id="c1"}`: {{1000, 1}, {2000, 2}, {3000, 3}}, // 2000 in both: once
		`{__name__="y", _id="c1"}`: {{1000, 1}},
	}, got, "never another tenant's data, each sample once")
	require.Len(t, warnings, 1)
	require.Contains(t, warnings[0], "peer "+host(down)+" unavailable")
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.reads.WithLabelValues("error")))
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.reads.WithLabelValues("success")))

	// Label calls ask the peers' label endpoints.
	q, err = r.Querier("acme", 0, 10_000)
	require.NoError(t, err)
	names, _, err := q.LabelValues(context.Background(), "__name__", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"x", "y"}, names)
	ln, _, err := q.LabelNames(context.Background(), nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "y"))
	require.NoError(t, err)
	require.Equal(t, []string{"__name__", "_id"}, ln)
	require.NoError(t, q.Close())

	// The series endpoint's series-only Selects see the peer's series.
	q, err = r.Querier("acme", 0, 10_000)
	require.NoError(t, err)
	ss := q.Select(context.Background(), true, &promstorage.SelectHints{Start: 0, End: 10_000, Func: "series"}, labels.MustNewMatcher(labels.MatchEqual, "__name__", "y"))
	require.True(t, ss.Next())
	require.Equal(t, `{__name__="y", _id="c1"}`, ss.At().Labels().String())
	require.False(t, ss.Next())
	require.NoError(t, q.Close())
}

func TestPeersSkippedWhenTheBucketCoversTheRange(t *testing.T) {
	f := newFixture(t)
	peerB := f.set(t, nil, f.config())
	var reads atomic.Int64
	b := serve(t, peerB, tenantDBs{"acme": openDB(t, map[string][]int64{"x": {5000}})}, func(string) int64 {
		reads.Add(1)
		return 4000
	})
	// A stopped clock: a horizon is trusted for horizon_ttl (1m) after it
	// arrived, however slowly this test runs.
	cfg := f.config(host(b))
	require.NoError(t, cfg.Validate())
	stopped := time.Now()
	var synced atomic.Bool
	a, err := New(discard, nil, cfg, Options{HTTPClient: f.client, Now: func() time.Time { return stopped },
		BucketSynced: func(time.Time) bool { return synced.Load() }})
	require.NoError(t, err)
	r := a.NewReader(tenantDBs{})
	query := func(maxt int64) {
		q, err := r.Querier("acme", 0, maxt)
		require.NoError(t, err)
		readAll(t, q)
	}
	query(3000) // no horizon known yet: read
	require.Equal(t, int64(1), reads.Load())
	query(3000) // known, but the bucket has not synced since
	require.Equal(t, int64(2), reads.Load())
	synced.Store(true)
	query(3000) // the bucket holds everything before 4000
	require.Equal(t, int64(2), reads.Load())
	require.Equal(t, 1.0, testutil.ToFloat64(a.m.reads.WithLabelValues("skipped")))
	query(4000) // ends after the horizon
	require.Equal(t, int64(3), reads.Load())
	q, err := r.Querier("other", 0, 3000) // another tenant's horizon is not known
	require.NoError(t, err)
	readAll(t, q)
	require.Equal(t, int64(4), reads.Load())
}

func TestReceiverRecognisesItself(t *testing.T) {
	f := newFixture(t)
	var s *Set
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, s.Instance())
		http.Error(w, "", http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	s = f.set(t, reg, f.config(host(srv)))
	require.Len(t, s.snapshot(), 1)
	q, err := s.NewReader(tenantDBs{}).Querier("acme", 0, 1)
	require.NoError(t, err)
	readAll(t, q)
	require.Empty(t, s.snapshot())
	require.Equal(t, 0.0, testutil.ToFloat64(s.m.peers))
	s.Refresh(context.Background())
	require.Empty(t, s.snapshot(), "still itself after a refresh")
}

// remoteRead posts a sampled remote-read request for up{} with the given
// headers and returns the status and the series' names.
func remoteRead(t *testing.T, url string, hdr map[string]string) (int, []string) {
	t.Helper()
	req := &prompb.ReadRequest{Queries: []*prompb.Query{{
		StartTimestampMs: 0, EndTimestampMs: 10_000,
		Matchers: []*prompb.LabelMatcher{{Type: prompb.LabelMatcher_RE, Name: "__name__", Value: ".+"}},
	}}}
	raw, err := proto.Marshal(req)
	require.NoError(t, err)
	r, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(snappy.Encode(nil, raw)))
	require.NoError(t, err)
	r.Header.Set("Content-Encoding", "snappy")
	r.Header.Set("Content-Type", "application/x-protobuf")
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	body := new(bytes.Buffer)
	_, err = body.ReadFrom(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	dec, err := snappy.Decode(nil, body.Bytes())
	require.NoError(t, err)
	var rr prompb.ReadResponse
	require.NoError(t, proto.Unmarshal(dec, &rr))
	var names []string
	for _, ts := range rr.Results[0].Timeseries {
		for _, l := range ts.Labels {
			if l.Name == "__name__" {
				names = append(names, l.Value)
			}
		}
	}
	return resp.StatusCode, names
}

func TestRemoteReadTenancy(t *testing.T) {
	f := newFixture(t)
	s := f.set(t, nil, f.config())
	srv := serve(t, s, tenantDBs{
		"acme":   openDB(t, map[string][]int64{"a": {1000}}),
		"globex": openDB(t, map[string][]int64{"g": {1000}}),
	}, func(string) int64 { return math.MinInt64 })
	defer http.DefaultClient.CloseIdleConnections()

	for _, tc := range []struct {
		name  string
		hdr   map[string]string
		code  int
		names []string
	}{
		{"tenant token reads its tenant", map[string]string{"Authorization": "Bearer acme-read"}, 200, []string{"a"}},
		{"tenant header ignored with a tenant token", map[string]string{"Authorization": "Bearer acme-read", TenantHeader: "globex", ScopeHeader: ScopeLocal}, 200, []string{"a"}},
		{"no credential", nil, 401, nil},
		{"replica token reads the named tenant, local", map[string]string{"Authorization": "Bearer replica-secret", TenantHeader: "globex", ScopeHeader: ScopeLocal}, 200, []string{"g"}},
		{"replica token needs local scope", map[string]string{"Authorization": "Bearer replica-secret", TenantHeader: "globex"}, 403, nil},
		{"replica token needs a tenant", map[string]string{"Authorization": "Bearer replica-secret", ScopeHeader: ScopeLocal}, 401, nil},
		{"replica token with an invalid tenant", map[string]string{"Authorization": "Bearer replica-secret", ScopeHeader: ScopeLocal, TenantHeader: "../x"}, 401, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, names := remoteRead(t, srv.URL, tc.hdr)
			require.Equal(t, tc.code, code)
			require.Equal(t, tc.names, names)
		})
	}
}

func TestTenantTokenPreferredOverReplicaToken(t *testing.T) {
	f := newFixture(t)
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "acme"), []byte("acme-read\n"), 0o600))
	var seen atomic.Pointer[http.Header]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		seen.Store(&h)
		http.Error(w, "", http.StatusTeapot)
	}))
	t.Cleanup(srv.Close)
	cfg := f.config(host(srv))
	cfg.TenantTokenFiles = map[string]string{"acme": filepath.Join(f.dir, "acme")}
	s := f.set(t, nil, cfg)
	require.Equal(t, []string{"acme"}, s.Tenants())
	read := func(tenant string) http.Header {
		q, err := s.NewReader(tenantDBs{}).Querier(tenant, 0, 1)
		require.NoError(t, err)
		_, ws := readAll(t, q)
		require.Len(t, ws, 1)
		return *seen.Load()
	}
	h := read("acme")
	require.Equal(t, "Bearer acme-read", h.Get("Authorization"))
	require.Empty(t, h.Get(TenantHeader))
	require.Equal(t, ScopeLocal, h.Get(ScopeHeader))
	h = read("globex")
	require.Equal(t, "Bearer replica-secret", h.Get("Authorization"))
	require.Equal(t, "globex", h.Get(TenantHeader))
}

type fakeResolver struct{ fail atomic.Bool }

func (r *fakeResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	if r.fail.Load() {
		return nil, errors.New("dns down")
	}
	switch host {
	case "rcv.svc":
		return []net.IPAddr{{IP: net.ParseIP("10.0.0.1")}, {IP: net.ParseIP("10.0.0.2")}}, nil
	case "r3.rcv.svc":
		return []net.IPAddr{{IP: net.ParseIP("10.0.0.3")}}, nil
	}
	return nil, errors.New("no such host")
}

func (r *fakeResolver) LookupSRV(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
	if r.fail.Load() {
		return "", nil, errors.New("dns down")
	}
	return "", []*net.SRV{{Target: "r3.rcv.svc", Port: 9292}}, nil
}

func TestDiscovery(t *testing.T) {
	f := newFixture(t)
	cfg := f.config("static:9291", "dns+rcv.svc:9291", "dnssrv+_http._tcp.rcv.svc")
	res := &fakeResolver{}
	s, err := New(discard, nil, cfg, Options{HTTPClient: f.client, Resolver: res})
	require.NoError(t, err)
	addrs := func() []string {
		var out []string
		for _, p := range s.snapshot() {
			out = append(out, p.addr)
		}
		return out
	}
	require.Equal(t, []string{"static:9291"}, addrs(), "static peers are known at once")
	s.Refresh(context.Background())
	want := []string{"10.0.0.1:9291", "10.0.0.2:9291", "10.0.0.3:9292", "static:9291"}
	require.Equal(t, want, addrs())
	res.fail.Store(true)
	s.Refresh(context.Background())
	require.Equal(t, want, addrs(), "a failed resolution keeps the peers")
	require.Equal(t, 1.0, testutil.ToFloat64(s.m.discoveries.WithLabelValues("error")))
}

func TestConfigValidate(t *testing.T) {
	c := Config{
		Endpoints:        []string{"ok:1", "dns+ok:1", "dnssrv+_x._tcp.ok", "noport", "dnssrv+x:1", "srv+x:1"},
		Scheme:           "ftp",
		ReplicaTokenFile: "/nonexistent",
		TenantTokenFiles: map[string]string{"../x": "/nonexistent"},
	}
	c.SetDefaults()
	c.Scheme = "ftp"
	err := c.Validate()
	for _, want := range []string{"peers.endpoints[3]", "peers.endpoints[4]", "peers.endpoints[5]", "peers.scheme", "peers.replica_token_file", "peers.tenant_token_files.../x: invalid tenant"} {
		require.ErrorContains(t, err, want)
	}
	require.NotContains(t, err.Error(), "peers.endpoints[0]")
	require.NotContains(t, err.Error(), "peers.endpoints[1]")
	require.NotContains(t, err.Error(), "peers.endpoints[2]")
}

// Peers over mTLS: the peers' tls_config verifies the peer and presents the
// client certificate a peer's web config requires; without it, the peer is
// a warning (the handshake fails), never a failed query.
func TestPeersOverMutualTLS(t *testing.T) {
	f := newFixture(t)
	ca := webtlstest.NewCA(t, "peers")
	serverCert, serverKey := ca.Server(t, "127.0.0.1")
	pair, err := tls.LoadX509KeyPair(serverCert, serverKey)
	require.NoError(t, err)

	peerB := f.set(t, nil, f.config())
	local := tenantDBs{"acme": openDB(t, map[string][]int64{"x": {1000}})}
	eng := promql.NewEngine(promql.EngineOpts{Logger: discard, MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	mux := http.NewServeMux()
	mux.Handle("/api/v1/read", peerB.Handler(discard, nil, local, local, nil, query.ReadOptions{}))
	mux.Handle(pushdown.Path, pushdown.NewHandler(discard, eng, query.NewQueryable(local), "_id", nil))
	srv := httptest.NewUnstartedServer(auth.Middleware(peerB.Authenticator(tokens{}), auth.PermRead, nil, mux))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "https://")

	set := func(tc webtls.ClientConfig) *Set {
		cfg := f.config(addr)
		cfg.Scheme, cfg.TLSConfig = "https", tc
		require.NoError(t, cfg.Validate())
		rt, err := tc.NewRoundTripper(nil)
		require.NoError(t, err)
		s, err := New(discard, nil, cfg, Options{HTTPClient: &http.Client{Transport: rt}})
		require.NoError(t, err)
		return s
	}
	read := func(tc webtls.ClientConfig) (map[string][]sample, []string) {
		q, err := set(tc).NewReader(tenantDBs{}).Querier("acme", 0, 10_000)
		require.NoError(t, err)
		return readAll(t, q)
	}
	ctx := auth.WithIdentity(context.Background(), auth.Identity{Tenant: "acme", Allow: auth.PermRead})
	pushdownReq := pushdown.Request{Query: "count(x)", Start: time.UnixMilli(1000), End: time.UnixMilli(1000)}
	clientCert, clientKey := ca.Client(t, "replica-a")
	caFile := ca.File

	got, warnings := read(webtls.ClientConfig{CAFile: caFile, CertFile: clientCert, KeyFile: clientKey})
	require.Empty(t, warnings)
	require.Equal(t, map[string][]sample{`{__name__="x", _id="c1"}`: {{1000, 1}}}, got)

	res, err := set(webtls.ClientConfig{CAFile: caFile, CertFile: clientCert, KeyFile: clientKey}).Shards()[0].Eval(ctx, pushdownReq)
	require.NoError(t, err, "pushdown over mTLS")
	require.Equal(t, []string{"c1"}, res.Keys)

	got, warnings = read(webtls.ClientConfig{CAFile: caFile}) // no client certificate
	require.Empty(t, got)
	require.Len(t, warnings, 1, "refused by the peer's mTLS: a warning")
	_, err = set(webtls.ClientConfig{CAFile: caFile}).Shards()[0].Eval(ctx, pushdownReq)
	require.ErrorIs(t, err, pushdown.ErrUnavailable, "refused by the peer's mTLS: unavailable")
}

// TestConfigDefaults: the defaults docs/scale-out.md shows, and that
// docs/rules.md counts with (a slow peer holds each rule peers.timeout).
func TestConfigDefaults(t *testing.T) {
	var c Config
	c.SetDefaults()
	require.Equal(t, "http", c.Scheme)
	require.Equal(t, 30*time.Second, time.Duration(c.RefreshInterval))
	require.Equal(t, 30*time.Second, time.Duration(c.Timeout))
	require.Equal(t, time.Minute, time.Duration(c.HorizonTTL))
	require.True(t, c.PushdownEnabled())
}
