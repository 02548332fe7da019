package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientpush "github.com/prometheus/client_golang/prometheus/push"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	pushclient "github.com/phonehome/phonehome/push/client"
)

// roundRobin is the test's load balancer: each request goes to the next
// backend, as "round-robin" in docs/scale-out.md.
type roundRobin struct {
	mu       sync.Mutex
	backends []*url.URL
	next     int
}

func (rr *roundRobin) set(ps ...*Process) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.backends = rr.backends[:0]
	for _, p := range ps {
		u, _ := url.Parse(p.URL())
		rr.backends = append(rr.backends, u)
	}
	rr.next = 0
}

func (rr *roundRobin) pick() *url.URL {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	u := rr.backends[rr.next%len(rr.backends)]
	rr.next++
	return u
}

func startRoundRobin(t *testing.T) (*roundRobin, string) {
	t.Helper()
	rr := &roundRobin{}
	srv := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(rr.pick())
	}})
	t.Cleanup(srv.Close)
	return rr, srv.URL
}

// installRun is one installer invocation's push.
type installRun struct{ platform, version, result, duration string }

func (r installRun) key() string {
	return r.platform + "/" + r.version + "/" + r.result + "/" + r.duration
}

// push sends the run through the load balancer at base: even runs with the
// installer's client (push/client), odd runs with client_golang's push
// client (Add), as both are in use.
func (r installRun) push(base string, i int) error {
	ret := map[string]string{"success": "0", "failure": "1"}[r.result]
	if i%2 == 0 {
		c := pushclient.New(pushclient.Options{URL: base, Token: pushToken, Timeout: 30 * time.Second, Getenv: func(string) string { return "" }})
		c.Counter("cluster_installation_invocation", "Installer invocations.").
			AddLabelValue("command", "create").AddLabelValue("target", "cluster").AddLabelValue("os", "linux").
			AddLabelValue("platform", r.platform).AddLabelValue("version", r.version).
			AddLabelValue("result", r.result).AddLabelValue("return", ret).AddLabelValue("duration", r.duration)
		return c.Push(context.Background())
	}
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cluster_installation_invocation", Help: "Installer invocations."},
		[]string{"command", "target", "os", "platform", "version", "result", "return", "duration"})
	c.WithLabelValues("create", "cluster", "linux", r.platform, r.version, r.result, ret, r.duration).Inc()
	reg.MustRegister(c)
	return clientpush.New(base, "installer").Gatherer(reg).Client(&http.Client{Timeout: 30 * time.Second}).
		Header(http.Header{"Authorization": {"Bearer " + pushToken}}).Add()
}

// installTotals is what the shipped rules and dashboard panel must answer
// for a set of runs.
type installTotals struct {
	total    map[string]float64 // platform/version
	ratio    map[string]float64 // platform/version
	byLength map[string]float64 // platform/version/duration, successes
	all      float64
}

func totalsOf(runs []installRun) installTotals {
	t := installTotals{total: map[string]float64{}, ratio: map[string]float64{}, byLength: map[string]float64{}}
	ok := map[string]float64{}
	for _, r := range runs {
		pv := r.platform + "/" + r.version
		t.total[pv]++
		t.all++
		if r.result == "success" {
			ok[pv]++
			t.byLength[pv+"/"+r.duration]++
		}
	}
	for pv, n := range t.total {
		t.ratio[pv] = ok[pv] / n
	}
	return t
}

// shippedInstallQueries are the expressions of the installation rules in
// deploy/rules/fleet.rules.yaml and of the duration panel of
// deploy/grafana/dashboards/phonehome-installations.json, read from the
// files, so the test checks what ships.
func shippedInstallQueries(t *testing.T) (total, ratio, byLength string) {
	t.Helper()
	b, err := os.ReadFile("../deploy/rules/fleet.rules.yaml")
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Rules []struct {
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &f))
	rules := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			rules[r.Record] = r.Expr
		}
	}
	total = rules["phonehome:installations:total_by_platform_version"]
	require.NotEmpty(t, total)
	// The ratio rule divides by the total rule's series: inline it, as the
	// rule is not evaluated on a receiver without rules configured.
	ratio = strings.ReplaceAll(rules["phonehome:installations:success_ratio_by_platform_version"],
		"phonehome:installations:total_by_platform_version", "("+total+")")
	require.Contains(t, ratio, "cluster_installation_invocation")

	b, err = os.ReadFile("../deploy/grafana/dashboards/phonehome-installations.json")
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	for _, p := range d.Panels {
		if p.Title == "Successful installations by duration" {
			byLength = p.Targets[0].Expr
		}
	}
	require.NotEmpty(t, byLength)
	return total, ratio, byLength
}

// vectorByLabels runs an instant query and keys its result by the values of
// the given labels, joined with "/".
func vectorByLabels(base, q string, keys ...string) (map[string]float64, error) {
	code, resp, err := queryAPI(base, q)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK || resp.Status != "success" {
		return nil, fmt.Errorf("%s: %d %s", q, code, resp.Error)
	}
	if len(resp.Warnings) > 0 {
		return nil, fmt.Errorf("%s: warnings %v", q, resp.Warnings)
	}
	var r queryResult
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, s := range r.Result {
		var parts []string
		for _, k := range keys {
			parts = append(parts, s.Metric[k])
		}
		var v string
		if err := json.Unmarshal(s.Value[1], &v); err != nil {
			return nil, err
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, err
		}
		out[strings.Join(parts, "/")] = f
	}
	return out, nil
}

type apiResponseWarnings struct {
	Status   string          `json:"status"`
	Data     json.RawMessage `json:"data"`
	Error    string          `json:"error"`
	Warnings []string        `json:"warnings"`
}

func queryAPI(base, q string) (int, apiResponseWarnings, error) {
	var out apiResponseWarnings
	req, err := http.NewRequest(http.MethodGet, base+"/api/v1/query?"+url.Values{"query": {q}}.Encode(), nil)
	if err != nil {
		return 0, out, err
	}
	req.Header.Set("Authorization", "Bearer "+pushToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, out, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, err
}

// requireShippedTotals polls until the shipped rules' and panel's queries
// on base give exactly want.
func requireShippedTotals(t *testing.T, base string, want installTotals) {
	t.Helper()
	total, ratio, byLength := shippedInstallQueries(t)
	eventually(t, time.Minute, func() error {
		for _, c := range []struct {
			q    string
			keys []string
			want map[string]float64
		}{
			{total, []string{"platform", "version"}, want.total},
			{ratio, []string{"platform", "version"}, want.ratio},
			{byLength, []string{"platform", "version", "duration"}, want.byLength},
			{`sum(cluster_installation_invocation)`, nil, map[string]float64{"": want.all}},
		} {
			got, err := vectorByLabels(base, c.q, c.keys...)
			if err != nil {
				return err
			}
			if !maps.Equal(got, c.want) {
				return fmt.Errorf("%s\n got %v\nwant %v", c.q, got, c.want)
			}
		}
		return nil
	})
}

// TestPushReplicasSumExactly: installer pushes spread round-robin over three
// receiver replicas that share a versitygw S3 bucket (and read each other's
// heads as peers) read back as the exact sums, through the rules and
// dashboard panel that ship in deploy/: before any block is shipped (each
// replica's own partial sums, and the fleet's totals on every replica
// through its peers), from a receiver on an empty disk without peers once
// the replicas have shipped, and again after the replicas restarted (state
// recovered from their disks), took more pushes and shipped again.
func TestPushReplicasSumExactly(t *testing.T) {
	dir := t.TempDir()
	s3Addr := startVersityGW(t, filepath.Join(dir, "s3"))
	secretFile := filepath.Join(dir, "s3-secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(s3Secret+"\n"), 0o600))
	replicaToken := filepath.Join(dir, "replica-token")
	require.NoError(t, os.WriteFile(replicaToken, []byte("replicas-only-s3cret\n"), 0o600))
	// The replicas listen on addresses chosen up front, so each lists all
	// three as peers (itself included, as a headless Service does).
	names := []string{"r0", "r1", "r2"}
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	replicaConfig := func(name string, peers []string) string {
		rdir := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(rdir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(rdir, "tokens.yaml"),
			[]byte("tokens:\n- token: "+pushToken+"\n  tenant: installs\n"), 0o600))
		cfg := fmt.Sprintf(`auth:
  tokens_file: tokens.yaml
push:
  flush_interval: 1s
  rate_limit: {requests_per_second: 100000, burst: 100000}
storage:
  external_labels: {replica: %s}
  ship_interval: 1h
  bucket:
    type: s3
    s3:
      bucket: %s
      endpoint: %s
      region: us-east-1
      access_key: %s
      secret_key_file: %s
      insecure: true
      bucket_lookup_type: path
bucket_store:
  sync_interval: 1s
  cache_max_bytes: 64MiB
`, name, s3Bucket, s3Addr, s3Access, secretFile)
		if peers != nil {
			cfg += fmt.Sprintf("peers:\n  endpoints: [%s]\n  replica_token_file: %s\n  timeout: 5s\n", strings.Join(peers, ", "), replicaToken)
		}
		p := filepath.Join(rdir, "receiver.yaml")
		require.NoError(t, os.WriteFile(p, []byte(cfg), 0o600))
		return p
	}
	start := func() []*Process {
		var ps []*Process
		for i, n := range names {
			ps = append(ps, startReceiver(t, replicaConfig(n, addrs), filepath.Join(dir, n, "data"), "--web.listen-address="+addrs[i]))
		}
		return ps
	}
	rr, lb := startRoundRobin(t)

	// Five runs of the same counter (the case) and a mix around it.
	var runs []installRun
	for range 5 {
		runs = append(runs, installRun{"aws", "4.16.3", "success", "25"})
	}
	runs = append(runs,
		installRun{"aws", "4.16.3", "failure", "50"},
		installRun{"gcp", "4.17.0", "success", "30"},
		installRun{"gcp", "4.17.0", "success", "30"},
		installRun{"aws", "4.17.0", "success", "25"},
		installRun{"gcp", "4.17.0", "failure", "5"},
		installRun{"aws", "4.16.3", "success", "30"},
	)
	pushAll := func(runs []installRun) {
		t.Helper()
		for i, r := range runs {
			require.NoError(t, r.push(lb, i), "push %d", i)
		}
	}

	replicas := start()
	rr.set(replicas...)
	pushAll(runs)

	// Before shipping: every replica holds the partial sums of the pushes
	// it received, labelled with its own push_replica; they add up exactly.
	eventually(t, 30*time.Second, func() error {
		sum := map[string]float64{}
		for i, p := range replicas {
			got, err := vectorByLabels(p.URL(), fmt.Sprintf(`sum by (platform, version, result, duration) (cluster_installation_invocation{push_replica=%q})`, names[i]),
				"platform", "version", "result", "duration")
			if err != nil {
				return err
			}
			if len(got) == 0 {
				return fmt.Errorf("%s has no partial sums yet", names[i])
			}
			for k, v := range got {
				sum[k] += v
			}
		}
		want := map[string]float64{}
		for _, r := range runs {
			want[r.key()]++
		}
		if !maps.Equal(sum, want) {
			return fmt.Errorf("partials add up to %v, want %v", sum, want)
		}
		return nil
	})
	for i, p := range replicas {
		mfs := scrapeMetrics(t, p.URL())
		require.Equal(t, float64(len(runs)/3+btoi(i < len(runs)%3)), metricValue(mfs, "phonehome_push_accepted_pushes_total", nil), names[i])
		require.Equal(t, 0.0, metricValue(mfs, "phonehome_push_expired_series_total", nil), names[i])
		var unlabelled queryResult
		apiDataToken(t, p.URL(), pushToken, `cluster_installation_invocation{push_replica=""}`, &unlabelled)
		require.Empty(t, unlabelled.Result, "every aggregated series carries push_replica")
	}
	// And any replica, reading its peers' heads, gives the fleet's totals
	// through the shipped rule and panel queries.
	for _, p := range replicas {
		requireShippedTotals(t, p.URL(), totalsOf(runs))
	}

	// After shipping, from a receiver on an empty disk: the replicas stop
	// (final push flush, head flushed into blocks, uploaded).
	for _, p := range replicas {
		p.Stop()
	}
	reader := startReceiver(t, replicaConfig("r3", nil), filepath.Join(dir, "r3", "data")) // no peers: the bucket only
	requireShippedTotals(t, reader.URL(), totalsOf(runs))

	// After a restart: each replica recovers its partial sums from its disk
	// and adds the new pushes to them; shipped again, the sums stay exact.
	replicas = start()
	rr.set(replicas[1], replicas[2], replicas[0]) // another rotation
	more := []installRun{
		{"aws", "4.16.3", "success", "25"},
		{"aws", "4.16.3", "success", "25"},
		{"gcp", "4.17.0", "failure", "5"},
		{"aws", "4.16.3", "failure", "50"},
	}
	pushAll(more)
	requireShippedTotals(t, replicas[2].URL(), totalsOf(slices.Concat(runs, more))) // heads + bucket
	for _, p := range replicas {
		p.Stop()
	}
	requireShippedTotals(t, reader.URL(), totalsOf(slices.Concat(runs, more)))

	mfs := scrapeMetrics(t, reader.URL())
	require.Equal(t, 0.0, metricValue(mfs, "phonehome_bucketstore_downloads_total", map[string]string{"result": "error"}))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// apiDataToken runs an instant query now with token and decodes the result.
func apiDataToken(t *testing.T, base, token, q string, v *queryResult) {
	t.Helper()
	apiData(t, base, token, "/api/v1/query", url.Values{"query": {q}}, v)
}
