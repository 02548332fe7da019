package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// fleet builds one remote-write request for a simulated fleet: samples every
// minute between two offsets (in minutes, <= 0) from t0.
type fleet struct {
	t0      time.Time
	req     prompb.WriteRequest
	current map[string]int // _id → series with a recent sample (what phonehome:cluster_series:count counts)
}

func (f *fleet) add(from, to int, v float64, kv ...string) {
	ls := labels.FromStrings(kv...)
	ts := prompb.TimeSeries{Labels: prompb.FromLabels(ls, nil)}
	for m := from; m <= to; m++ {
		ts.Samples = append(ts.Samples, prompb.Sample{Value: v, Timestamp: f.t0.Add(time.Duration(m) * time.Minute).UnixMilli()})
	}
	f.req.Timeseries = append(f.req.Timeseries, ts)
	if id := ls.Get("_id"); id != "" && to >= -2 {
		f.current[id]++
	}
}

// buildFleet: c01..c10 report; c01..c03 fail CSV foo 1.0.0 (flapping between
// phases, as OLM deletes csv_abnormal on each change); kubevirt is unhealthy
// on c04..c06; odf is at risk on c07 and healthy on c08; etcd is unstable on
// c09; c10 runs an old gathering definition; c11 went silent 30m ago.
func buildFleet(t0 time.Time) *fleet {
	f := &fleet{t0: t0, current: map[string]int{}}
	for i := 1; i <= 10; i++ {
		id := fmt.Sprintf("c%02d", i)
		f.add(-20, 0, 1, "__name__", "cluster_version", "_id", id, "type", "current", "version", "4.16.3")
		gd := "v2"
		if i == 10 {
			gd = "v1"
		}
		f.add(-20, 0, 1, "__name__", "phonehome_gathering_definition_info", "_id", id, "version", gd)
		succeeded := 1.0
		if i <= 3 {
			succeeded = 0
			f.add(-20, -2, 1, "__name__", "csv_abnormal", "_id", id, "namespace", "ns", "name", "foo.v1.0.0", "version", "1.0.0", "phase", "Failed", "reason", "InstallCheckFailed")
			f.add(-1, 0, 1, "__name__", "csv_abnormal", "_id", id, "namespace", "ns", "name", "foo.v1.0.0", "version", "1.0.0", "phase", "Pending", "reason", "NeedsReinstall")
		}
		f.add(-20, 0, succeeded, "__name__", "csv_succeeded", "_id", id, "namespace", "ns", "name", "foo.v1.0.0", "version", "1.0.0")
	}
	alert := func(id, name, impact, part string) {
		f.add(-20, 0, 1, "__name__", "alerts", "_id", id, "alertname", name, "alertstate", "firing",
			"kubernetes_operator_part_of", part, "operator_health_impact", impact)
	}
	for _, id := range []string{"c04", "c05", "c06"} {
		alert(id, "VirtControllerDown", "critical", "kubevirt")
	}
	for _, name := range []string{"CephA", "CephB", "CephC"} {
		alert("c07", name, "warning", "odf")
	}
	alert("c08", "CephA", "warning", "odf")
	f.add(-20, 0, 1, "__name__", "cluster_operator:unstable:5m", "_id", "c09", "name", "etcd")
	f.add(-20, 0, 0, "__name__", "cluster_operator:unstable:5m", "_id", "c01", "name", "dns")
	f.add(-60, -30, 1, "__name__", "cluster_version", "_id", "c11", "type", "current", "version", "4.15.9")
	return f
}

// quantile is PromQL's quantile().
func quantile(q float64, vs []float64) float64 {
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	rank := q * float64(len(s)-1)
	lo := math.Floor(rank)
	hi := math.Min(lo+1, float64(len(s)-1))
	w := rank - lo
	return s[int(lo)]*(1-w) + s[int(hi)]*w
}

type dashboardFile struct {
	UID    string `json:"uid"`
	Panels []struct {
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// TestFleetRules writes a simulated fleet and installer pushes to the real
// receiver, runs every dashboard query against its API (and the self-metrics
// panels against a real Prometheus scraping it), and reads the fleet alerts
// back from a real Alertmanager.
func TestFleetRules(t *testing.T) {
	dir := t.TempDir()

	// Alertmanager, gossip off.
	amAddr := freeAddr(t)
	amCfg := filepath.Join(dir, "alertmanager.yml")
	require.NoError(t, os.WriteFile(amCfg, []byte("route:\n  receiver: blackhole\n  group_wait: 1s\n  group_interval: 1s\nreceivers:\n- name: blackhole\n"), 0o600))
	am := startProcess(t, "/usr/bin/prometheus-alertmanager", "alertmanager", []string{
		"--config.file=" + amCfg, "--storage.path=" + filepath.Join(dir, "am"),
		"--web.listen-address=" + amAddr, "--cluster.listen-address=",
	}, func(line string) (string, bool) { return amAddr, strings.Contains(line, "Listening on") })
	waitHTTP(t, am.URL()+"/-/ready", http.StatusOK)

	// The shipped rule files, with every `for:` shortened so alerts fire at
	// once (promtool's tests cover the real durations).
	src, err := os.ReadFile("../deploy/rules/fleet.rules.yaml")
	require.NoError(t, err)
	rulesFile := filepath.Join(dir, "fleet.rules.yaml")
	short := regexp.MustCompile(`(?m)^(\s+)for: \S+$`).ReplaceAll(src, []byte("${1}for: 0s"))
	require.NoError(t, os.WriteFile(rulesFile, short, 0o600))

	cfgPath := writeReceiverConfig(t, dir, "", "")
	f, err := os.OpenFile(cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = fmt.Fprintf(f, "push:\n  flush_interval: 1s\nrules:\n  files: [%q]\n  evaluation_interval: 1s\n  reload_interval: 1s\n  alertmanagers:\n  - url: %s\n",
		rulesFile, am.URL())
	require.NoError(t, err)
	require.NoError(t, f.Close())
	recv := startReceiver(t, cfgPath, filepath.Join(dir, "data"))

	// A real Prometheus scrapes the receiver's own metrics (phonehome-self).
	prom := startPrometheus(t, fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n- job_name: receiver\n  static_configs:\n  - targets: [%q]\n", recv.Addr))

	// The fleet, in one request, so rules never see half of it.
	fl := buildFleet(time.Now().Truncate(time.Second))
	mustWrite(t, recv.URL(), tokenAcme, &fl.req)

	// Installer pushes (aggregating: equal label sets are summed).
	push := func(platform, version, result, duration string) {
		body := fmt.Sprintf("# TYPE cluster_installation_invocation counter\ncluster_installation_invocation{command=\"create\",target=\"cluster\",os=\"linux\",platform=%q,result=%q,return=\"0\",version=%q,duration=%q} 1\n",
			platform, result, version, duration)
		r, err := http.NewRequest(http.MethodPost, recv.URL()+"/metrics/job/installer", strings.NewReader(body))
		require.NoError(t, err)
		r.Header.Set("Authorization", "Bearer "+tokenAcme)
		r.Header.Set("Content-Type", "text/plain; version=0.0.4")
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Less(t, resp.StatusCode, 300, "push: %s", b)
	}
	for range 4 {
		push("aws", "4.16.3", "success", "25")
	}
	push("aws", "4.16.3", "failure", "50")
	push("gcp", "4.17.0", "success", "30")
	push("gcp", "4.17.0", "success", "30")

	var counts []float64
	for _, n := range fl.current {
		counts = append(counts, float64(n))
	}
	seriesMax := 0.0
	for _, c := range counts {
		seriesMax = math.Max(seriesMax, c)
	}
	gdByCluster := map[string]float64{}
	for i := 1; i <= 10; i++ {
		v := "v2"
		if i == 10 {
			v = "v1"
		}
		gdByCluster[fmt.Sprintf(`{_id="c%02d",version="%s"}`, i, v)] = 1
	}

	// Every panel target of every dashboard, with its expected result
	// (labels → value). A panel without an expectation fails the test.
	want := map[string]map[string]float64{
		"Clusters failing per CSV version/A":             {`{name="foo.v1.0.0",version="1.0.0"}`: 3},
		"Fraction of clusters failing per CSV version/A": {`{name="foo.v1.0.0",version="1.0.0"}`: 0.3},
		"Clusters running each CSV version/A":            {`{name="foo.v1.0.0",version="1.0.0"}`: 10},
		"Failing CSVs by phase and reason/A": {
			`{name="foo.v1.0.0",phase="Failed",reason="InstallCheckFailed",version="1.0.0"}`: 3,
			`{name="foo.v1.0.0",phase="Pending",reason="NeedsReinstall",version="1.0.0"}`:    3,
		},
		"Clusters where the operator is unhealthy/A": {`{kubernetes_operator_part_of="kubevirt"}`: 3},
		"Clusters where the operator is at risk/A":   {`{kubernetes_operator_part_of="odf"}`: 1},
		"Alerts behind operator health/A": {
			`{alertname="VirtControllerDown",kubernetes_operator_part_of="kubevirt",operator_health_impact="critical"}`: 3,
			`{alertname="CephA",kubernetes_operator_part_of="odf",operator_health_impact="warning"}`:                    2,
			`{alertname="CephB",kubernetes_operator_part_of="odf",operator_health_impact="warning"}`:                    1,
			`{alertname="CephC",kubernetes_operator_part_of="odf",operator_health_impact="warning"}`:                    1,
		},
		"At-risk threshold (warning alerts)/A":  {`{__name__="phonehome:operator_health:warning_threshold"}`: 2},
		"Clusters with the operator unstable/A": {`{name="etcd"}`: 1},
		"Unstable operators by cluster/A":       {`{_id="c09",name="etcd"}`: 1},
		"Installation success rate by platform and version/A": {
			`{__name__="phonehome:installations:success_ratio_by_platform_version",platform="aws",version="4.16.3"}`: 0.8,
			`{__name__="phonehome:installations:success_ratio_by_platform_version",platform="gcp",version="4.17.0"}`: 1,
		},
		"Installations by platform and version/A": {
			`{__name__="phonehome:installations:total_by_platform_version",platform="aws",version="4.16.3"}`: 5,
			`{__name__="phonehome:installations:total_by_platform_version",platform="gcp",version="4.17.0"}`: 2,
		},
		"Successful installations by duration/A": {
			`{duration="25",platform="aws",version="4.16.3"}`: 4,
			`{duration="30",platform="gcp",version="4.17.0"}`: 2,
		},
		"Clusters reporting/A":                   {`{__name__="phonehome:clusters_reporting:count"}`: 10},
		"Clusters gone silent/A":                 {`{__name__="phonehome:cluster_silent:cluster",_id="c11"}`: 1},
		"Series per cluster against the limit/A": {`{}`: quantile(0.5, counts)},
		"Series per cluster against the limit/B": {`{}`: quantile(0.99, counts)},
		"Series per cluster against the limit/C": {`{}`: seriesMax},
		"Series per cluster against the limit/D": {`{}`: 10000},
		"Clusters per gathering-definition version/A": {
			`{__name__="phonehome:gathering_definition:clusters_by_version",version="v2"}`: 9,
			`{__name__="phonehome:gathering_definition:clusters_by_version",version="v1"}`: 1,
		},
		"Gathering-definition version by cluster/A": gdByCluster,
	}
	// Self-metrics: every rejection reason is exported, and nothing was rejected.
	selfWant := map[string]bool{"Samples rejected by reason/A": true}

	files, err := filepath.Glob("../deploy/grafana/dashboards/*.json")
	require.NoError(t, err)
	require.Len(t, files, 5)
	seen := map[string]bool{}
	for _, file := range files {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		var d dashboardFile
		require.NoError(t, json.Unmarshal(b, &d), file)
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			vars["$"+v.Name] = v.Query
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				key := p.Title + "/" + tg.RefID
				expr := tg.Expr
				for k, v := range vars {
					expr = strings.ReplaceAll(expr, k, v)
				}
				seen[key] = true
				if p.Datasource.UID == "phonehome-self" {
					require.True(t, selfWant[key], "no expectation for self-metrics panel %q", key)
					eventually(t, time.Minute, func() error {
						got, err := queryValues(prom.URL(), "", expr)
						if err != nil {
							return err
						}
						if len(got) < 2 {
							return fmt.Errorf("%s: %d reasons: %v", key, len(got), got)
						}
						for k, v := range got {
							if !strings.Contains(k, `reason="`) || v != 0 {
								return fmt.Errorf("%s: %s = %v", key, k, v)
							}
						}
						return nil
					})
					continue
				}
				exp, ok := want[key]
				require.True(t, ok, "no expectation for panel %q (%s)", key, expr)
				require.Equal(t, "phonehome", p.Datasource.UID, key)
				eventually(t, time.Minute, func() error {
					got, err := queryValues(recv.URL(), tokenAcme, expr)
					if err != nil {
						return err
					}
					return sameValues(exp, got)
				})
			}
		}
	}
	for k := range want {
		require.True(t, seen[k], "expectation %q matches no dashboard panel", k)
	}

	// The fleet alerts, as the receiver's API serves them and as they reach
	// Alertmanager.
	wantAlerts := []string{
		`CSVFailingPersistently{_id="c01",name="foo.v1.0.0"}`,
		`CSVFailingPersistently{_id="c02",name="foo.v1.0.0"}`,
		`CSVFailingPersistently{_id="c03",name="foo.v1.0.0"}`,
		`ClusterGoneSilent{_id="c11"}`,
		`ClusterOperatorUnstable{_id="c09",name="etcd"}`,
		`GatheringDefinitionStale{_id="c10",version="v1"}`,
		`OperatorUnhealthyFleetWide{kubernetes_operator_part_of="kubevirt"}`,
		`OperatorVersionFailingOnManyClusters{name="foo.v1.0.0",version="1.0.0"}`,
	}
	eventually(t, time.Minute, func() error {
		var got []string
		var data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		}
		code, resp := apiGet(t, recv.URL(), tokenAcme, "/api/v1/alerts", nil)
		if code != http.StatusOK {
			return fmt.Errorf("/api/v1/alerts: %d", code)
		}
		if err := json.Unmarshal(resp.Data, &data); err != nil {
			return err
		}
		for _, a := range data.Alerts {
			if a.State == "firing" {
				got = append(got, alertKey(a.Labels))
			}
		}
		return sameStrings(wantAlerts, got)
	})
	eventually(t, time.Minute, func() error {
		resp, err := http.Get(am.URL() + "/api/v2/alerts?active=true")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var alerts []struct {
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&alerts); err != nil {
			return err
		}
		var got []string
		for _, a := range alerts {
			if a.Labels["tenant"] != "acme" {
				return fmt.Errorf("alert without tenant=acme: %v", a.Labels)
			}
			if a.Annotations["summary"] == "" || a.Annotations["runbook_url"] == "" {
				return fmt.Errorf("alert without annotations: %v", a)
			}
			got = append(got, alertKey(a.Labels))
		}
		return sameStrings(wantAlerts, got)
	})

	// Rules are tenant-scoped: the other tenant sees none.
	var rulesData struct {
		Groups []struct {
			Name string `json:"name"`
		} `json:"groups"`
	}
	apiData(t, recv.URL(), tokenAcme, "/api/v1/rules", nil, &rulesData)
	require.Len(t, rulesData.Groups, 5)
	apiData(t, recv.URL(), tokenOther, "/api/v1/rules", nil, &rulesData)
	require.Empty(t, rulesData.Groups)
}

// alertKey renders an alert's name and its identifying labels.
func alertKey(ls map[string]string) string {
	var parts []string
	for _, k := range []string{"_id", "kubernetes_operator_part_of", "name", "version"} {
		if v, ok := ls[k]; ok {
			if k == "version" && ls["alertname"] == "CSVFailingPersistently" {
				continue
			}
			parts = append(parts, fmt.Sprintf("%s=%q", k, v))
		}
	}
	return ls["alertname"] + "{" + strings.Join(parts, ",") + "}"
}

func sameStrings(want, got []string) error {
	sort.Strings(got)
	w := append([]string(nil), want...)
	sort.Strings(w)
	if strings.Join(w, "\n") != strings.Join(got, "\n") {
		return fmt.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(w, "\n"))
	}
	return nil
}

// queryValues runs an instant query now and returns labels → value.
func queryValues(base, token, expr string) (map[string]float64, error) {
	r, err := http.NewRequest(http.MethodGet, base+"/api/v1/query?"+url.Values{"query": {expr}}.Encode(), nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env apiResponse
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return nil, err
	}
	if env.Status != "success" {
		return nil, fmt.Errorf("%s: %s %s", expr, env.ErrorType, env.Error)
	}
	var res queryResult
	if err := json.Unmarshal(env.Data, &res); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, s := range res.Result {
		var v string
		if len(s.Value) != 2 || json.Unmarshal(s.Value[1], &v) != nil {
			return nil, fmt.Errorf("%s: unexpected value %s", expr, s.Value)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, err
		}
		delete(s.Metric, "__name__") // functions may or may not keep it; the labels matter
		out[labelKey(s.Metric)] = f
	}
	return out, nil
}

// labelKey renders labels as {a="1",b="2"}, sorted by name.
func labelKey(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

var nameLabel = regexp.MustCompile(`__name__="[^"]*",?`)

func sameValues(wantRaw, got map[string]float64) error {
	want := map[string]float64{}
	for k, v := range wantRaw {
		want[nameLabel.ReplaceAllString(k, "")] = v
	}
	for k, v := range want {
		g, ok := got[k]
		if !ok || math.Abs(g-v) > 1e-9 {
			return fmt.Errorf("got %v, want %v", got, want)
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("got %v, want %v", got, want)
	}
	return nil
}
