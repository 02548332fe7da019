package e2e

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestReplicasAnswerLikeOneReceiver runs three receiver replicas on one real
// S3 bucket (versitygw), each configured with the others as peers, and a
// fourth, single receiver fed the same data as the reference. Writes reach
// the replicas through a proxy that hashes the Authorization header
// consistently, as the load-balancer recipes in docs/scale-out.md do; each
// cluster has its own credential, and one cluster is moved to another
// replica mid-run (a renewed credential hashing elsewhere). After every
// round of writes — before any block is shipped, and later with blocks cut
// and shipped — every replica's instant, range, series and label answers
// equal the single receiver's, with no warning: r0 and r1 push query parts
// down to the replicas, r2 has peers.pushdown: false and reads the peers'
// series. A fleet recording rule and a
// fleet alert (which fires only on the whole fleet's data) are evaluated by
// the one replica rules.evaluator_replica names, give the single receiver's answer,
// and the alert reaches a real Alertmanager from that replica only. A real
// Prometheus reads the fleet through remote_read from one replica. With one
// replica killed, the others answer with a warning and the rest of the data.
func TestReplicasAnswerLikeOneReceiver(t *testing.T) {
	dir := t.TempDir()
	s3Addr := startVersityGW(t, filepath.Join(dir, "s3"))
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	secretFile := write("s3-secret", s3Secret+"\n")
	replicaToken := write("replica-token", "r3plica-t0ken\n")

	// Alertmanager, gossip off.
	amAddr := freeAddr(t)
	amCfg := write("alertmanager.yml", "route:\n  receiver: blackhole\n  group_wait: 1s\n  group_interval: 1s\nreceivers:\n- name: blackhole\n")
	am := startProcess(t, "/usr/bin/prometheus-alertmanager", "alertmanager", []string{
		"--config.file=" + amCfg, "--storage.path=" + filepath.Join(dir, "am"),
		"--web.listen-address=" + amAddr, "--cluster.listen-address=",
	}, func(line string) (string, bool) { return amAddr, strings.Contains(line, "Listening on") })
	waitHTTP(t, am.URL()+"/-/ready", http.StatusOK)

	// A fleet recording rule and a fleet alert: six clusters of acme report,
	// no replica holds more than three of them.
	rulesFile := write("fleet.rules.yaml", `groups:
- name: fleet
  interval: 1s
  rules:
  - record: fleet:clusters:count
    expr: count(count by (_id) (replica_m))
  - alert: FleetWide
    expr: count(count by (_id) (replica_m)) >= 6
    labels: {severity: info}
`)

	// Clusters: c1..c6 of acme, c7, c8 of other, each with its own bound
	// credential, chosen so that the proxy's hash spreads them over the
	// three replicas; c3 renews its credential mid-run and moves.
	names := []string{"r0", "r1", "r2"}
	type cluster struct {
		id, tenant string
		tokens     []string // in use order
		replicas   []int    // where each token hashes
	}
	var clusters []*cluster
	tokensYAML := fmt.Sprintf("tokens:\n- token: %q\n  tenant: acme\n- token_sha256: %q\n  tenant: other\n", tokenAcme, sha256Hex(tokenOther))
	for i := 1; i <= 8; i++ {
		c := &cluster{id: fmt.Sprintf("c%d", i), tenant: "acme"}
		if i > 6 {
			c.tenant = "other"
		}
		want := []int{(i - 1) % 3}
		if c.id == "c3" {
			want = append(want, (want[0]+1)%3)
		}
		for _, w := range want {
			for salt := 0; ; salt++ {
				tok := fmt.Sprintf("%s-%s-%d", c.tenant, c.id, salt)
				if replicaFor("Bearer "+tok, names) == w && !slices.Contains(c.tokens, tok) {
					c.tokens, c.replicas = append(c.tokens, tok), append(c.replicas, w)
					break
				}
			}
		}
		for _, tok := range c.tokens {
			tokensYAML += fmt.Sprintf("- token: %q\n  tenant: %s\n  cluster_id: %s\n  allow: [write]\n", tok, c.tenant, c.id)
		}
		clusters = append(clusters, c)
	}
	tokensFile := write("tokens.yaml", tokensYAML)

	// As in the shipped StatefulSet, the replica label is a variable the
	// receiver expands (POD_NAME there), set as each receiver starts, and
	// the replicas name their evaluator by it.
	receiverConfig := func(name string, peers []string) string {
		evaluator := names[0]
		if peers == nil {
			evaluator = name // the single receiver evaluates its own rules
		}
		rdir := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(rdir, 0o755))
		bucket := "    type: filesystem\n"
		if peers != nil {
			bucket = fmt.Sprintf("    type: s3\n    s3:\n      bucket: %s\n      endpoint: %s\n      region: us-east-1\n      access_key: %s\n      secret_key_file: %s\n      insecure: true\n      bucket_lookup_type: path\n",
				s3Bucket, s3Addr, s3Access, secretFile)
		}
		cfg := fmt.Sprintf(`auth:
  tokens_file: %s
storage:
  external_labels:
    replica: ${PHONEHOME_E2E_REPLICA}
  block_duration: 10m
  ship_interval: 1s
  bucket:
%sbucket_store:
  sync_interval: 1s
  cache_max_bytes: 64MiB
rules:
  files: [%q]
  evaluation_interval: 1s
  reload_interval: 1s
  evaluator_replica: %s
`, tokensFile, bucket, rulesFile, evaluator)
		if peers != nil {
			cfg += fmt.Sprintf("  alertmanagers:\n  - url: %s\npeers:\n  endpoints: [%s]\n  replica_token_file: %s\n  timeout: 5s\n",
				am.URL(), strings.Join(peers, ", "), replicaToken)
			if name == "r2" { // reads the peers' series for every query: the same answers
				cfg += "  pushdown: false\n"
			}
		}
		p := filepath.Join(rdir, "receiver.yaml")
		require.NoError(t, os.WriteFile(p, []byte(cfg), 0o600))
		return p
	}

	// The replicas listen on addresses chosen up front, so that each can
	// list all three as peers (itself included, as a headless Service does).
	addrs := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	replicas := make([]*Process, 3)
	for i, name := range names {
		t.Setenv("PHONEHOME_E2E_REPLICA", name) // the receiver inherits it at its start
		replicas[i] = startReceiver(t, receiverConfig(name, addrs), filepath.Join(dir, name, "data"), "--web.listen-address="+addrs[i])
	}
	t.Setenv("PHONEHOME_E2E_REPLICA", "single")
	single := startReceiver(t, receiverConfig("single", nil), filepath.Join(dir, "single", "data"))

	proxy := newHashProxy(t, replicas, names)

	// 90 samples per cluster, 30s apart, ending now, written in five rounds.
	t0 := time.Now().Add(-45 * time.Minute).Truncate(time.Minute)
	const rounds, perRound = 5, 18
	ts := func(j int) int64 { return t0.Add(time.Duration(j) * 30 * time.Second).UnixMilli() }
	tenantToken := map[string]string{"acme": tokenAcme, "other": tokenOther}
	writeRound := func(round int) {
		t.Helper()
		for ci, c := range clusters {
			tok := c.tokens[0]
			if len(c.tokens) > 1 && round >= 3 {
				tok = c.tokens[1] // renewed: the proxy moves c3 to another replica
			}
			s := prompb.TimeSeries{Labels: labelsOf("__name__", "replica_m", "_id", c.id, "job", "fleet")}
			for j := round * perRound; j < (round+1)*perRound; j++ {
				s.Samples = append(s.Samples, prompb.Sample{Timestamp: ts(j), Value: float64(ci*1000+j) + 0.25})
			}
			req := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{s}}
			mustWrite(t, proxy.URL, tok, req)
			mustWrite(t, single.URL(), tok, req)
		}
	}

	end := time.UnixMilli(ts(rounds*perRound - 1))
	compare := func(round int) {
		t.Helper()
		last := time.UnixMilli(ts((round+1)*perRound - 1))
		for tenant, tok := range tenantToken {
			for _, q := range fleetQueries(t0, last, end) {
				want, ws := repAPI(t, single.URL(), tok, q.path, q.params)
				require.Empty(t, ws)
				for i, r := range replicas {
					got, ws := repAPI(t, r.URL(), tok, q.path, q.params)
					require.Empty(t, ws, "%s round %d %s %v", names[i], round, q.path, q.params)
					require.Equal(t, want, got, "%s, tenant %s, round %d: %s %v", names[i], tenant, round, q.path, q.params)
				}
			}
		}
	}

	writeRound(0)
	// Nothing is shipped yet: 9 minutes of data, blocks are 10 minutes.
	require.Equal(t, 0.0, metricValue(scrapeMetrics(t, replicas[0].URL()), "phonehome_bucketstore_blocks", nil))
	compare(0)
	for round := 1; round < rounds; round++ {
		writeRound(round)
		compare(round)
	}
	// Blocks are cut and shipped (45 minutes of data, 10-minute blocks);
	// the answers stay the same once the bucket holds them.
	eventually(t, time.Minute, func() error {
		for i, r := range replicas {
			if n := metricValue(scrapeMetrics(t, r.URL()), "phonehome_bucketstore_blocks", nil); n < 6 {
				return fmt.Errorf("%s sees %v blocks in the bucket", names[i], n)
			}
		}
		return nil
	})
	compare(rounds - 1)
	mfs := scrapeMetrics(t, replicas[1].URL())
	require.Positive(t, metricValue(mfs, "phonehome_peers_reads_total", map[string]string{"result": "success"}))
	require.Equal(t, 0.0, metricValue(mfs, "phonehome_peers_reads_total", map[string]string{"result": "error"}))
	require.Equal(t, 2.0, metricValue(mfs, "phonehome_peers", nil), "itself recognised and left out")
	// Before shipping, queries were evaluated on each replica and combined
	// (pushdown); parts that read the moved cluster c3 on two replicas, and
	// ranges that reach the bucket, were evaluated over the merged series.
	for _, outcome := range []string{"pushed", "overlap"} {
		require.Positive(t, metricValue(mfs, "phonehome_query_pushdown_parts_total", map[string]string{"outcome": outcome}), outcome)
	}
	require.Positive(t, metricValue(mfs, "phonehome_query_pushdown_queries_total", map[string]string{"outcome": "bucket"}))
	require.Equal(t, 0.0, metricValue(mfs, "phonehome_query_pushdown_parts_total", map[string]string{"outcome": "error"}))
	require.Equal(t, -1.0, metricValue(scrapeMetrics(t, replicas[2].URL()), "phonehome_query_pushdown_queries_total", nil),
		"r2 has peers.pushdown: false: no pushdown engine")

	// Fleet rules: evaluated by r0 alone over the fleet view; the recorded
	// series reads the same from every replica and from the single receiver.
	for tenant, want := range map[string]string{"acme": "6", "other": "2"} {
		eventually(t, time.Minute, func() error {
			for _, base := range []string{single.URL(), replicas[0].URL(), replicas[1].URL(), replicas[2].URL()} {
				r := instant(t, base, tenantToken[tenant], "fleet:clusters:count", time.Now())
				if len(r.Result) != 1 || string(r.Result[0].Value[1]) != `"`+want+`"` {
					return fmt.Errorf("%s: fleet:clusters:count of %s = %v, want %s", base, tenant, r.Result, want)
				}
			}
			return nil
		})
	}
	firing := func(base string) []string {
		var data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		}
		apiData(t, base, tokenAcme, "/api/v1/alerts", nil, &data)
		var out []string
		for _, a := range data.Alerts {
			out = append(out, a.Labels["alertname"]+"/"+a.State)
		}
		return out
	}
	eventually(t, time.Minute, func() error {
		if got := firing(single.URL()); !slices.Equal(got, []string{"FleetWide/firing"}) {
			return fmt.Errorf("single receiver: %v", got)
		}
		if got := firing(replicas[0].URL()); !slices.Equal(got, []string{"FleetWide/firing"}) {
			return fmt.Errorf("r0: %v", got)
		}
		return nil
	})
	require.Empty(t, firing(replicas[1].URL()), "r1 does not evaluate")
	eventually(t, time.Minute, func() error {
		resp, err := http.Get(am.URL() + "/api/v2/alerts?active=true")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var alerts []struct {
			Labels map[string]string `json:"labels"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&alerts); err != nil {
			return err
		}
		if len(alerts) != 1 || alerts[0].Labels["alertname"] != "FleetWide" || alerts[0].Labels["tenant"] != "acme" {
			return fmt.Errorf("alertmanager has %v", alerts)
		}
		return nil
	})
	// Sent by r0 only: the other replicas send nothing.
	require.Positive(t, metricValue(scrapeMetrics(t, replicas[0].URL()), "prometheus_notifications_sent_total", nil))
	for _, r := range replicas[1:] {
		require.LessOrEqual(t, metricValue(scrapeMetrics(t, r.URL()), "prometheus_notifications_sent_total", nil), 0.0)
		require.LessOrEqual(t, metricValue(scrapeMetrics(t, r.URL()), "prometheus_rule_evaluations_total", nil), 0.0)
	}

	// A real Prometheus reads the fleet through remote_read from r1.
	prom := startPrometheus(t, fmt.Sprintf(`remote_read:
- url: %s/api/v1/read
  read_recent: true
  authorization:
    credentials: %s
`, replicas[1].URL(), tokenAcme))
	// Prometheus 2.x (Debian's) closes range and lookback windows on the
	// left, Prometheus 3.x (the receiver's engine) opens them: times off the
	// 30s sample grid keep the two engines' answers comparable.
	offGrid := end.Add(15 * time.Second)
	var promQueries []fleetQuery
	for _, q := range []string{"replica_m", "sum by (_id) (replica_m)", "count_over_time(replica_m[45m])", "rate(replica_m[5m])", "count(replica_m)"} {
		promQueries = append(promQueries, fleetQuery{"/api/v1/query", url.Values{"query": {q}, "time": {formatTime(offGrid)}}})
	}
	for _, q := range []string{"sum(replica_m)", "replica_m"} {
		promQueries = append(promQueries, fleetQuery{"/api/v1/query_range", url.Values{
			"query": {q}, "start": {formatTime(t0.Add(15 * time.Second))}, "end": {formatTime(offGrid)}, "step": {"60"},
		}})
	}
	for _, q := range promQueries {
		want, _ := repAPI(t, single.URL(), tokenAcme, q.path, q.params)
		got, ws := repAPI(t, prom.URL(), "", q.path, q.params)
		require.Empty(t, ws)
		require.Equal(t, want, got, "prometheus via remote_read: %s %v", q.path, q.params)
	}

	// One replica killed: the others answer with a warning and the rest.
	replicas[2].Kill()
	onR2 := map[string]bool{}
	for _, c := range clusters {
		if slices.Contains(c.replicas, 2) {
			onR2[c.id] = true
		}
	}
	require.NotEmpty(t, onR2)
	for _, r := range replicas[:2] {
		params := url.Values{"query": {"replica_m"}, "time": {formatTime(end)}}
		want, _ := repAPI(t, single.URL(), tokenAcme, "/api/v1/query", params)
		got, ws := repAPI(t, r.URL(), tokenAcme, "/api/v1/query", params)
		require.NotEmpty(t, ws)
		require.Contains(t, ws[0], "peer "+addrs[2]+" unavailable")
		require.Equal(t, withoutClusters(t, want, onR2), withoutClusters(t, got, onR2))
	}
	require.Positive(t, metricValue(scrapeMetrics(t, replicas[0].URL()), "phonehome_peers_reads_total", map[string]string{"result": "error"}))

	// The fleet rules do not evaluate over the partial view: r0 skips
	// them, counts it, and its alert keeps firing.
	eventually(t, time.Minute, func() error {
		if v := metricValue(scrapeMetrics(t, replicas[0].URL()), "phonehome_rules_partial_evaluations_total", nil); v <= 0 {
			return fmt.Errorf("%v partial evaluations skipped", v)
		}
		return nil
	})
	require.Equal(t, []string{"FleetWide/firing"}, firing(replicas[0].URL()), "the alert holds its state")
	// Remote read refuses to answer partially: Prometheus sees the failure.
	_, ws := repAPI(t, prom.URL(), "", "/api/v1/query", url.Values{"query": {"count(replica_m)"}, "time": {formatTime(offGrid)}})
	require.NotEmpty(t, ws, "a remote read that lacks r2's head is an error, not a smaller answer")
}

// fleetQuery is one API call of the comparison.
type fleetQuery struct {
	path   string
	params url.Values
}

// fleetQueries are the calls every replica must answer as the single
// receiver does: instant queries at the newest sample and before it, range
// queries over all of it, series and label values.
func fleetQueries(t0, last, end time.Time) []fleetQuery {
	var out []fleetQuery
	for _, at := range []time.Time{last, t0.Add(7 * time.Minute), last.Add(-3 * time.Minute)} {
		for _, q := range []string{
			"replica_m", "sum by (_id) (replica_m)", "count_over_time(replica_m[15m])",
			"rate(replica_m[5m])", "count(replica_m)", "replica_m[2m]",
		} {
			out = append(out, fleetQuery{"/api/v1/query", url.Values{"query": {q}, "time": {formatTime(at)}}})
		}
	}
	for _, q := range []string{"sum(replica_m)", "replica_m", "max_over_time(replica_m[10m])"} {
		out = append(out, fleetQuery{"/api/v1/query_range", url.Values{
			"query": {q}, "start": {formatTime(t0)}, "end": {formatTime(end)}, "step": {"60"},
		}})
	}
	rng := url.Values{"start": {formatTime(t0)}, "end": {formatTime(end)}}
	series := url.Values{"match[]": {"replica_m"}}
	for k, v := range rng {
		series[k] = v
	}
	out = append(out,
		fleetQuery{"/api/v1/series", series},
		fleetQuery{"/api/v1/label/_id/values", rng},
	)
	return out
}

// repAPI calls an API endpoint, requires success and returns its data in a
// canonical form (results sorted, so that the order of series does not
// matter) and its warnings.
func repAPI(t *testing.T, base, token, path string, params url.Values) (string, []string) {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, base+path+"?"+params.Encode(), nil)
	require.NoError(t, err)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s %v: %s", base, path, params, b)
	var env struct {
		Data     json.RawMessage `json:"data"`
		Warnings []string        `json:"warnings"`
	}
	require.NoError(t, json.Unmarshal(b, &env))
	return canonical(t, env.Data), env.Warnings
}

// canonical sorts the elements of a result list (a query's "result", or a
// series or label list) by their JSON.
func canonical(t *testing.T, data json.RawMessage) string {
	t.Helper()
	sortList := func(list []json.RawMessage) []json.RawMessage {
		sort.Slice(list, func(i, j int) bool { return string(list[i]) < string(list[j]) })
		return list
	}
	var q struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	}
	if json.Unmarshal(data, &q) == nil && q.ResultType != "" {
		q.Result = sortList(q.Result)
		b, err := json.Marshal(q)
		require.NoError(t, err)
		return string(b)
	}
	var list []json.RawMessage
	require.NoError(t, json.Unmarshal(data, &list), "%s", data)
	b, err := json.Marshal(sortList(list))
	require.NoError(t, err)
	return string(b)
}

// withoutClusters drops the series of the given clusters from a canonical
// vector result.
func withoutClusters(t *testing.T, data string, drop map[string]bool) string {
	t.Helper()
	var q struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  json.RawMessage   `json:"value"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(data), &q))
	var keep []string
	for _, s := range q.Result {
		if !drop[s.Metric["_id"]] {
			b, err := json.Marshal(s)
			require.NoError(t, err)
			keep = append(keep, string(b))
		}
	}
	return strings.Join(keep, "\n")
}

// replicaFor picks a replica for an Authorization header by rendezvous
// (highest random weight) hashing: consistent, as the load-balancer recipes
// (nginx `hash ... consistent`, HAProxy `hash-type consistent`, Envoy
// RING_HASH/MAGLEV) are — removing a replica moves only its clusters.
func replicaFor(authorization string, names []string) int {
	best, bestW := 0, uint64(0)
	for i, n := range names {
		h := fnv.New64a()
		_, _ = io.WriteString(h, n+"\x00"+authorization)
		if w := h.Sum64(); w >= bestW {
			best, bestW = i, w
		}
	}
	return best
}

// newHashProxy is the load balancer in front of the replicas' write path.
func newHashProxy(t *testing.T, replicas []*Process, names []string) *httptest.Server {
	t.Helper()
	targets := make([]*url.URL, len(replicas))
	for i, r := range replicas {
		u, err := url.Parse(r.URL())
		require.NoError(t, err)
		targets[i] = u
	}
	var mu sync.Mutex
	p := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		mu.Lock()
		defer mu.Unlock()
		pr.SetURL(targets[replicaFor(pr.In.Header.Get("Authorization"), names)])
	}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv
}
