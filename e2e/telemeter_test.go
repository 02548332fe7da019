package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang/snappy"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/relabel"
)

// Telemeter drop-in, end to end: the receiver takes what today's OpenShift
// clusters send to telemeter-server, on both of its paths.

const (
	telemeterFleetToken   = "pull-secret-cluster-a" // the token a cluster's pull secret holds
	telemeterRevokedToken = "pull-secret-revoked"
	telemeterReadToken    = "fleet-read"
	telemeterHashKey      = "fleet-cluster-id-key-0123456789abcdef"
	telemeterRawID        = fwdClusterID // a raw OpenShift cluster id (a UUID), as the fixture carries it
	telemeterUploadType   = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)

// telemeterPseudonym is the _id the receiver stores for a raw cluster id:
// base64url(HMAC-SHA256(key, id)[:16]).
func telemeterPseudonym(raw string) string {
	m := hmac.New(sha256.New, []byte(telemeterHashKey))
	m.Write([]byte(raw))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// writeTelemeterReceiverConfig writes a receiver that replaces
// telemeter-server: /authorize with signing keys, the fleet tokens of the
// clusters, the real telemetry allowlist enforced server-side, and a
// receiver-side hash of the raw cluster ids. It returns the config path.
func writeTelemeterReceiverConfig(t *testing.T, dir, extra string) string {
	t.Helper()
	writeSigningKey(t, dir, "k1")
	writeTelemeterTokens(t, dir, telemeterFleetToken, telemeterRevokedToken)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cluster-id-key"), []byte(telemeterHashKey+"\n"), 0o600))
	var b strings.Builder
	b.WriteString("auth:\n  tokens_file: tokens.yaml\n  keys_file: keys.yaml\n  credential_ttl: 1m\n  reload_interval: 1s\n")
	b.WriteString("  cluster_id_hash:\n    secret_file: cluster-id-key\n  telemeter:\n    token_cache_ttl: 5s\n")
	// The allowlist clusters gather by, and its ALERTS selectors renamed to
	// alerts: telemeter-client and the forwarder rename ALERTS by default.
	b.WriteString("allowlist:\n")
	for _, s := range telemetryAllowlist(t) {
		fmt.Fprintf(&b, "  - %q\n", s)
		if r := strings.Replace(s, `__name__="ALERTS"`, `__name__="alerts"`, 1); r != s {
			fmt.Fprintf(&b, "  - %q\n", r)
		}
	}
	b.WriteString(extra)
	p := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o600))
	return p
}

// writeTelemeterTokens writes the tokens file: the read token and the given
// fleet tokens, which may only be exchanged (as telemeter's pull-secret
// tokens).
func writeTelemeterTokens(t *testing.T, dir string, fleet ...string) {
	t.Helper()
	tokens := fmt.Sprintf("tokens:\n- {token: %q, tenant: fleet, allow: [read]}\n", telemeterReadToken)
	for _, f := range fleet {
		tokens += fmt.Sprintf("- {token: %q, tenant: fleet, allow: [authorize]}\n", f)
	}
	tmp := filepath.Join(dir, "tokens.yaml.tmp")
	require.NoError(t, os.WriteFile(tmp, []byte(tokens), 0o600))
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, "tokens.yaml")))
}

func telemetryAllowlist(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(fwdFixtures, "telemetry-allowlist.txt"))
	require.NoError(t, err)
	defer f.Close()
	sel, err := allowlist.ReadSelectors(f)
	require.NoError(t, err)
	return sel
}

// fixtureFamilies parses the federate fixture into metric families, as
// telemeter-client holds them after federating.
func fixtureFamilies(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fwdFixtures, "federate-sample.prom"))
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.LegacyValidation)
	m, err := p.TextToMetricFamilies(bytes.NewReader(b))
	require.NoError(t, err)
	var fams []*dto.MetricFamily
	for _, f := range m {
		fams = append(fams, f)
	}
	sort.Slice(fams, func(i, j int) bool { return fams[i].GetName() < fams[j].GetName() })
	return fams
}

// allowlistedFamilies is the fixture as telemeter-client federates it with
// the allowlist as its match[] selectors.
func allowlistedFamilies(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	al, err := allowlist.Parse(telemetryAllowlist(t))
	require.NoError(t, err)
	var out []*dto.MetricFamily
	for _, f := range fixtureFamilies(t) {
		kept := f.Metric[:0]
		for _, m := range f.Metric {
			lb := labels.NewBuilder(labels.FromStrings(model.MetricNameLabel, f.GetName()))
			for _, p := range m.GetLabel() {
				lb.Set(p.GetName(), p.GetValue())
			}
			if al.Allows(lb.Labels()) {
				kept = append(kept, m)
			}
		}
		if f.Metric = kept; len(kept) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// telemeterExpected is the fixture through the server-side allowlist with
// _id set to id, as sorted label strings.
func telemeterExpected(t *testing.T, id string, drop ...string) []string {
	t.Helper()
	al, err := allowlist.Parse(telemetryAllowlist(t))
	require.NoError(t, err)
	var out []string
	for _, f := range fixtureFamilies(t) {
		for _, m := range f.GetMetric() {
			lb := labels.NewBuilder(labels.FromStrings(model.MetricNameLabel, f.GetName()))
			for _, p := range m.GetLabel() {
				lb.Set(p.GetName(), p.GetValue())
			}
			lb.Set("_id", id)
			lb.Del(drop...)
			if ls := lb.Labels(); al.Allows(ls) {
				out = append(out, ls.String())
			}
		}
	}
	sort.Strings(out)
	return out
}

// telemeterClient speaks telemeter-client's protocol byte for byte
// (openshift/telemeter pkg/authorize/token_store.go, roundtripper.go,
// pkg/metricsclient, pkg/metricfamily/label.go): the authorize exchange (id
// in the query, no body, 200 or 201), then uploads of delimited
// MetricFamily messages in a framed snappy stream, sent chunked; it sets
// the labels the exchange returns on every metric, replacing a label of
// that name. When an upload is answered 401 it authorizes again and sends
// again at once, where telemeter-client drops the token and does both in
// its next cycle, a minute later: the same requests, sooner.
type telemeterClient struct {
	base, fleetToken, id string
	token                string
	labels               map[string]string
	unauthorized         int // 401s seen on uploads
}

func (c *telemeterClient) authorize(t *testing.T) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.base+"/authorize?id="+c.id, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+c.fleetToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	require.NoError(t, err)
	require.Contains(t, []int{http.StatusOK, http.StatusCreated}, resp.StatusCode, "authorize: %s", body)
	var tr struct {
		Version          int               `json:"version"`
		Token            string            `json:"token"`
		ExpiresInSeconds int64             `json:"expiresInSeconds"`
		Labels           map[string]string `json:"labels"`
	}
	require.NoError(t, json.Unmarshal(body, &tr))
	require.Equal(t, 1, tr.Version)
	require.GreaterOrEqual(t, tr.ExpiresInSeconds, int64(60), "telemeter-client caches tokens of 60s or more")
	c.token, c.labels = tr.Token, tr.Labels
}

// upload sends fams (with the exchange's labels added) and returns the
// final status, re-authorizing once after a 401.
func (c *telemeterClient) upload(t *testing.T, fams []*dto.MetricFamily) (int, string) {
	t.Helper()
	if c.token == "" {
		c.authorize(t)
	}
	code, body := postUpload(t, c.base, c.token, encodeFamilies(t, c.withLabels(fams)), nil)
	if code == http.StatusUnauthorized {
		c.unauthorized++
		c.authorize(t)
		code, body = postUpload(t, c.base, c.token, encodeFamilies(t, c.withLabels(fams)), nil)
	}
	return code, body
}

// withLabels overrides or adds the exchange's labels on every metric, as
// telemeter-client's label transformer does (appended, so unsorted).
func (c *telemeterClient) withLabels(fams []*dto.MetricFamily) []*dto.MetricFamily {
	out := make([]*dto.MetricFamily, len(fams))
	for i, f := range fams {
		f = proto.Clone(f).(*dto.MetricFamily)
		for _, m := range f.Metric {
			for k, v := range c.labels {
				setLabel(m, k, v)
			}
		}
		out[i] = f
	}
	return out
}

// setLabel sets a metric's label, adding it if missing.
func setLabel(m *dto.Metric, name, value string) {
	for _, p := range m.Label {
		if p.GetName() == name {
			p.Value = proto.String(value)
			return
		}
	}
	m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(name), Value: proto.String(value)})
}

// encodeFamilies is telemeter-client's metricsclient.Write: an expfmt
// delimited encoder over snappy's buffered (framed) writer.
func encodeFamilies(t *testing.T, fams []*dto.MetricFamily) []byte {
	t.Helper()
	var b bytes.Buffer
	w := snappy.NewBufferedWriter(&b)
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeProtoDelim))
	for _, f := range fams {
		require.NoError(t, enc.Encode(f))
	}
	require.NoError(t, w.Flush())
	return b.Bytes()
}

// postUpload POSTs body to /upload chunked, without a Content-Length, as
// telemeter-client does; hdr overrides headers.
func postUpload(t *testing.T, base, token string, body []byte, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/upload", io.NopCloser(bytes.NewReader(body)))
	require.NoError(t, err)
	req.ContentLength = -1 // chunked
	req.Header.Set("Content-Type", telemeterUploadType)
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("Authorization", "Bearer "+token)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// withTimestamp sets every metric's timestamp, as federation does.
func withTimestamp(fams []*dto.MetricFamily, ts time.Time) []*dto.MetricFamily {
	for _, f := range fams {
		for _, m := range f.Metric {
			m.TimestampMs = proto.Int64(ts.UnixMilli())
		}
	}
	return fams
}

// storedLabelSets returns the stored series of the fleet at ts, as sorted
// label strings without the drop labels.
func storedLabelSets(t *testing.T, base string, ts time.Time, drop ...string) []string {
	t.Helper()
	r := instant(t, base, telemeterReadToken, `{__name__=~".+"}`, ts)
	var out []string
	for _, s := range r.Result {
		out = append(out, labels.NewBuilder(labels.FromMap(s.Metric)).Del(drop...).Labels().String())
	}
	sort.Strings(out)
	return out
}

// requireNoRawID greps every file under dir and every log line for the raw
// cluster id.
func requireNoRawID(t *testing.T, dir string, logs []string) {
	t.Helper()
	files := 0
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		require.False(t, bytes.Contains(b, []byte(telemeterRawID)), "raw cluster id in %s", path)
		return nil
	}))
	require.Positive(t, files)
	for _, l := range logs {
		require.NotContains(t, l, telemeterRawID, "raw cluster id in the receiver's log")
	}
}

// TestTelemeterClientProtocolE2E drives the receiver with telemeter-client's
// wire protocol: the authorize exchange, framed snappy uploads of the
// fixture, renewal on 401 after a key rotation, binding, bad input.
func TestTelemeterClientProtocolE2E(t *testing.T) {
	dir := t.TempDir()
	cfg := writeTelemeterReceiverConfig(t, dir, "limits:\n  defaults:\n    max_body_bytes: 256KiB\n    max_decoded_bytes: 1MiB\n")
	data := filepath.Join(dir, "data")
	addr := freeAddr(t)
	recv := startReceiver(t, cfg, data, "--web.listen-address="+addr)
	pseudonym := telemeterPseudonym(telemeterRawID)
	for _, probe := range []string{"/healthz", "/healthz/ready"} { // telemeter-server's probes
		waitHTTP(t, recv.URL()+probe, http.StatusOK)
	}

	// telemeter-client sends the raw cluster id; the exchange binds its
	// pseudonym and returns it as the _id label to add.
	c := &telemeterClient{base: recv.URL(), fleetToken: telemeterFleetToken, id: telemeterRawID}
	c.authorize(t)
	require.Equal(t, map[string]string{"_id": pseudonym}, c.labels)

	// The whole fixture: what the allowlist refuses is dropped and counted,
	// and the upload succeeds (200), as telemeter-server's filtering did.
	// The samples are stored at the receive time, whatever their own
	// timestamp, and without the Prometheus replica's label.
	sentAt := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	before := time.Now()
	code, body := c.upload(t, withTimestamp(fixtureFamilies(t), sentAt))
	after := time.Now()
	require.Equal(t, http.StatusOK, code, body)
	want := telemeterExpected(t, pseudonym, "prometheus_replica")
	require.Len(t, want, 224, "the fixture through the real allowlist")
	require.Equal(t, want, storedLabelSets(t, recv.URL(), after), "every allowlisted series, bound to the pseudonym")
	require.Equal(t, 76.0, metricsValue(t, recv.URL(), "phonehome_receive_rejected_samples_total", map[string]string{"reason": "allowlist"}))
	storedAt := func(at time.Time) time.Time {
		t.Helper()
		r := instant(t, recv.URL(), telemeterReadToken, "max(timestamp("+allowlistedFamilies(t)[0].GetName()+"))", at)
		var got string
		require.NoError(t, json.Unmarshal(r.Result[0].Value[1], &got))
		sec, err := strconv.ParseFloat(got, 64)
		require.NoError(t, err)
		return time.UnixMilli(int64(math.Round(sec * 1000)))
	}
	ts := storedAt(after)
	require.False(t, ts.Before(before.Truncate(time.Millisecond)) || ts.After(after), "stored at the receive time: %v, not %v", ts, sentAt)
	require.Equal(t, 300.0, metricsValue(t, recv.URL(), "phonehome_receive_upload_restamped_total", map[string]string{"tense": "present"}), "every metric of the upload")

	// A cluster whose clock runs 15 minutes ahead still reports "now".
	skewed := time.Now().Add(15 * time.Minute)
	code, body = c.upload(t, withTimestamp(allowlistedFamilies(t), skewed))
	require.Equal(t, http.StatusOK, code, body)
	require.True(t, storedAt(time.Now()).After(ts), "stored now, not 15 minutes ahead")
	require.Equal(t, 224.0, metricsValue(t, recv.URL(), "phonehome_receive_upload_restamped_total", map[string]string{"tense": "future"}))

	// What telemeter-client federates with the allowlist as match[] is
	// accepted whole: 200, the only success it knows.
	code, body = c.upload(t, withTimestamp(allowlistedFamilies(t), time.Now()))
	require.Equal(t, http.StatusOK, code, body)

	// A series of another cluster is refused and counted; the rest is written.
	other := allowlistedFamilies(t)[:1]
	other[0].Metric = other[0].Metric[:1]
	setLabel(other[0].Metric[0], "_id", "another-cluster")
	code, body = postUpload(t, recv.URL(), c.token, encodeFamilies(t, withTimestamp(other, time.Now())), nil)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "does not match the authenticated cluster")
	require.Equal(t, 1.0, metricsValue(t, recv.URL(), "phonehome_receive_rejected_samples_total", map[string]string{"reason": "cluster_mismatch"}))

	// Bad input: each gets its 4xx, nothing is written, the receiver serves on.
	valid := encodeFamilies(t, c.withLabels(withTimestamp(allowlistedFamilies(t), time.Now())))
	var bomb bytes.Buffer
	bw := snappy.NewBufferedWriter(&bomb)
	_, _ = bw.Write(binary.AppendUvarint(nil, 2<<20))
	_, _ = bw.Write(make([]byte, 2<<20))
	require.NoError(t, bw.Flush())
	var declared bytes.Buffer
	dw := snappy.NewBufferedWriter(&declared)
	_, _ = dw.Write(binary.AppendUvarint(nil, 1<<40))
	require.NoError(t, dw.Flush())
	accepted := metricsValue(t, recv.URL(), "phonehome_receive_samples_total", map[string]string{"result": "accepted"})
	for _, tc := range []struct {
		name string
		body []byte
		hdr  map[string]string
		code int
	}{
		{"truncated frame", valid[:len(valid)-5], nil, http.StatusBadRequest},
		{"frame over the decoded cap", bomb.Bytes(), nil, http.StatusRequestEntityTooLarge},
		{"declared length over the cap", declared.Bytes(), nil, http.StatusBadRequest},
		{"wrong content type", valid, map[string]string{"Content-Type": "text/plain; version=0.0.4"}, http.StatusUnsupportedMediaType},
	} {
		code, body := postUpload(t, recv.URL(), c.token, tc.body, tc.hdr)
		require.Equal(t, tc.code, code, "%s: %s", tc.name, body)
	}
	require.Equal(t, accepted, metricsValue(t, recv.URL(), "phonehome_receive_samples_total", map[string]string{"result": "accepted"}), "nothing partial written")
	code, body = c.upload(t, withTimestamp(allowlistedFamilies(t), time.Now()))
	require.Equal(t, http.StatusOK, code, "still serving: %s", body)

	// Key rotation: the receiver restarts with a new signing key, the
	// client's credential is refused with 401, it re-authorizes and the
	// upload goes through.
	recv.Stop()
	writeSigningKey(t, dir, "k2")
	recv = startReceiver(t, cfg, data, "--web.listen-address="+addr)
	code, body = c.upload(t, withTimestamp(allowlistedFamilies(t), time.Now()))
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, 1, c.unauthorized, "one 401, then a new credential")

	// No byte of the raw id reaches the WAL, the blocks or the logs.
	logs := recv.Logs()
	recv.Stop()
	requireNoRawID(t, data, logs)
}

// cmoRemoteWriteConfig is the telemetry remote_write that
// cluster-monitoring-operator renders into the cluster's Prometheus: the
// base64 JSON bearer from a file, write_relabel_configs that set _id from
// the temporary cluster-id label and keep the allowlisted names, and its
// queue settings (batch_send_deadline shortened from 1m so the test does not
// wait a minute per batch). The fixture's series carry the external labels
// of replica prometheus-k8s-0; replica sets prometheus_replica instead, as
// the cluster's other Prometheus sends it.
func cmoRemoteWriteConfig(t *testing.T, exporterHost, receiver, tokenFile, replica string) string {
	t.Helper()
	return fixtureScrapeConfig(exporterHost) + fmt.Sprintf(`remote_write:
  - url: %s/metrics/v1/receive
    authorization:
      type: Bearer
      credentials_file: %s
    write_relabel_configs:
      - target_label: prometheus_replica
        replacement: %s
      - target_label: __tmp_openshift_cluster_id__
        replacement: %s
      - source_labels: [__name__]
        action: keep
        regex: %q
      - source_labels: [__tmp_openshift_cluster_id__]
        target_label: _id
      - action: labeldrop
        regex: __tmp_openshift_cluster_id__
    queue_config:
      capacity: 30000
      max_samples_per_send: 10000
      batch_send_deadline: 1s
      min_backoff: 1s
      max_backoff: 256s
`, receiver, tokenFile, replica, telemeterRawID, allowlistNamesRegex(t))
}

// allowlistNamesRegex is the metric names of the allowlist's selectors as
// one regex, as cluster-monitoring-operator keeps them.
func allowlistNamesRegex(t *testing.T) string {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	seen := map[string]bool{}
	var names []string
	for _, s := range telemetryAllowlist(t) {
		ms, err := p.ParseMetricSelector(s)
		require.NoError(t, err)
		for _, m := range ms {
			if m.Name != model.MetricNameLabel {
				continue
			}
			n := m.Value
			if m.Type == labels.MatchEqual {
				n = regexpQuote(n)
			}
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	return strings.Join(names, "|")
}

func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// telemeterRemoteWrite posts a remote-write 1.0 request to
// /metrics/v1/receive with a Telemeter bearer.
func telemeterRemoteWrite(t *testing.T, base, bearer string, ts ...prompb.TimeSeries) (int, string) {
	t.Helper()
	code, body, err := postWriteTo(http.DefaultClient, base+"/metrics/v1/receive", bearer, encodeWrite(t, &prompb.WriteRequest{Timeseries: ts}), nil)
	require.NoError(t, err)
	return code, body
}

func telemeterBearer(token, clusterID string) string {
	b, _ := json.Marshal(map[string]string{"authorization_token": token, "cluster_id": clusterID})
	return base64.StdEncoding.EncodeToString(b)
}

// TestTelemeterRemoteWritePrometheusE2E runs a real Prometheus configured as
// cluster-monitoring-operator configures its telemetry remote-write: the
// allowlisted series land bound to the cluster's pseudonym; a credential of
// cluster A cannot write for cluster B; a revoked token is refused once the
// cache TTL has passed; bad bearers are 401 and the receiver serves on.
func TestTelemeterRemoteWritePrometheusE2E(t *testing.T) {
	dir := t.TempDir()
	cfg := writeTelemeterReceiverConfig(t, dir, "")
	data := filepath.Join(dir, "data")
	recv := startReceiver(t, cfg, data)
	pseudonym := telemeterPseudonym(telemeterRawID)

	tokenFile := filepath.Join(dir, "telemetry-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(telemeterBearer(telemeterFleetToken, telemeterRawID)), 0o600))
	exporter := fixtureExporter(t)
	// The cluster's two Prometheus replicas both send: one is written, and
	// the series carry no replica label.
	var proms []*Process
	for _, replica := range []string{"prometheus-k8s-0", "prometheus-k8s-1"} {
		proms = append(proms, startPrometheus(t, cmoRemoteWriteConfig(t, strings.TrimPrefix(exporter.URL, "http://"), recv.URL(), tokenFile, replica)))
	}

	want := telemeterExpected(t, pseudonym, "job", "instance", "prometheus_replica")
	var got []string
	eventually(t, 90*time.Second, func() error {
		got = storedLabelSets(t, recv.URL(), time.Now(), "job", "instance")
		for _, w := range want {
			if sort.SearchStrings(got, w) == len(got) || got[sort.SearchStrings(got, w)] != w {
				return fmt.Errorf("%d of %d allowlisted series stored; missing %s", len(got), len(want), w)
			}
		}
		return nil
	})
	for _, s := range instant(t, recv.URL(), telemeterReadToken, `{__name__=~".+"}`, time.Now()).Result {
		require.Equal(t, pseudonym, s.Metric["_id"], "every series bound to the cluster's pseudonym: %v", s.Metric)
	}
	eventually(t, 30*time.Second, func() error {
		if v := metricsValue(t, recv.URL(), "phonehome_receive_telemeter_replica_dropped_samples_total", nil); v <= 0 {
			return fmt.Errorf("no sample of the other replica dropped yet (%v)", v)
		}
		return nil
	})
	for _, p := range proms { // neither replica sees a failure: no PrometheusRemoteStorageFailures
		require.Zero(t, metricsValue(t, p.URL(), "prometheus_remote_storage_samples_failed_total", nil))
		require.Positive(t, metricsValue(t, p.URL(), "prometheus_remote_storage_samples_total", nil))
	}
	eventually(t, 30*time.Second, func() error { // Prometheus' next batch: the fleet token's answer is reused
		if v := metricsValue(t, recv.URL(), "phonehome_auth_telemeter_token_checks_total", map[string]string{"result": "cached"}); v <= 0 {
			return fmt.Errorf("%v cached checks", v)
		}
		return nil
	})

	// Cluster A's credential carrying cluster B's series: refused, counted.
	bearerA := telemeterBearer(telemeterFleetToken, telemeterRawID)
	foreign := prompb.TimeSeries{
		Labels:  []prompb.Label{{Name: "__name__", Value: "cluster_version"}, {Name: "_id", Value: "cluster-b"}, {Name: "type", Value: "current"}},
		Samples: []prompb.Sample{{Value: 1, Timestamp: time.Now().UnixMilli()}},
	}
	code, body := telemeterRemoteWrite(t, recv.URL(), bearerA, foreign)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Positive(t, metricsValue(t, recv.URL(), "phonehome_receive_rejected_samples_total", map[string]string{"reason": "cluster_mismatch"}))

	// Bad bearers: 401, and the receiver serves on.
	for name, bearer := range map[string]string{
		"garbage base64":       "%%%not-base64%%%",
		"json without cluster": base64.StdEncoding.EncodeToString([]byte(`{"authorization_token":"` + telemeterFleetToken + `"}`)),
		"unknown token":        telemeterBearer("not-a-pull-secret", telemeterRawID),
		"plain fleet token":    telemeterFleetToken,
	} {
		code, body := telemeterRemoteWrite(t, recv.URL(), bearer, foreign)
		require.Equal(t, http.StatusUnauthorized, code, "%s: %s", name, body)
	}

	// Revocation: a token dropped from the tokens file is refused within
	// the reload interval (1s) plus the cache TTL (5s).
	bearerC := telemeterBearer(telemeterRevokedToken, "7d1e0c3b-2a4f-4e6d-8b9c-0a1b2c3d4e5f")
	series := func() prompb.TimeSeries {
		return prompb.TimeSeries{
			Labels:  []prompb.Label{{Name: "__name__", Value: "cluster_version"}, {Name: "type", Value: "current"}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: time.Now().UnixMilli()}},
		}
	}
	code, body = telemeterRemoteWrite(t, recv.URL(), bearerC, series())
	require.Equal(t, http.StatusNoContent, code, body)
	writeTelemeterTokens(t, dir, telemeterFleetToken)
	revokedAt := time.Now()
	eventually(t, 20*time.Second, func() error {
		if code, _ := telemeterRemoteWrite(t, recv.URL(), bearerC, series()); code != http.StatusUnauthorized {
			return fmt.Errorf("still %d", code)
		}
		return nil
	})
	// 1s + 5s, and room for a loaded CI machine; the TTL bound itself is
	// unit-tested with a fake clock (auth.TestTelemeterBearerBindsAndCaches).
	require.Less(t, time.Since(revokedAt), 12*time.Second, "revoked within reload interval + cache TTL")
	require.Positive(t, metricsValue(t, recv.URL(), "phonehome_auth_telemeter_token_checks_total", map[string]string{"result": "refused"}))

	logs := recv.Logs()
	for _, p := range proms {
		p.Stop()
	}
	recv.Stop()
	requireNoRawID(t, data, logs)
}

// TestForwarderTelemeterModeToReceiverE2E runs the forwarder in
// telemeter-client's protocol (--to-protocol=telemeter, as a cluster that
// switched its image before the fleet side moved) against the receiver that
// replaced telemeter-server: the fixture arrives through /authorize and
// /upload, bound to the forwarder's pseudonym, which the receiver's own
// cluster-id hash leaves as it is.
func TestForwarderTelemeterModeToReceiverE2E(t *testing.T) {
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	var want []string // the forwarder elides the Prometheus replica's labels (--elide-label's default)
	for _, w := range expectedSeries(t, hashedID) {
		ls, err := parser.NewParser(parser.Options{}).ParseMetric(w)
		require.NoError(t, err)
		want = append(want, ls.String())
	}
	sort.Strings(want)
	prom := startFixturePrometheus(t, fixtureExporter(t))
	waitFederated(t, prom.URL())

	dir := t.TempDir()
	recv := startReceiver(t, writeTelemeterReceiverConfig(t, dir, ""), filepath.Join(dir, "data"))
	tok := filepath.Join(dir, "fleet-token")
	require.NoError(t, os.WriteFile(tok, []byte(telemeterFleetToken+"\n"), 0o600))
	fwd := startBinary(t, "forwarder", append(forwarderArgs(t, prom.URL(), recv.URL(), filepath.Join(dir, "queue"), "--interval=1s"),
		"--to-token-file="+tok, "--to-protocol=telemeter")...)

	eventually(t, time.Minute, func() error {
		got := storedLabelSets(t, recv.URL(), time.Now(), "job", "instance")
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			return fmt.Errorf("%d of %d series stored", len(got), len(want))
		}
		return nil
	})
	require.Equal(t, 1.0, metricsValue(t, fwd.URL(), "phonehome_forward_delivery_protocol", map[string]string{"protocol": "telemeter"}))
	require.Positive(t, metricsValue(t, recv.URL(), "phonehome_receive_decoded_requests_total", map[string]string{"proto": "io.prometheus.client.MetricFamily"}))
	require.Zero(t, metricsValue(t, recv.URL(), "phonehome_receive_decoded_requests_total", map[string]string{"proto": "prometheus.WriteRequest"}))
	// telemeter-client's /federate: what the last cycle sent, anonymized.
	resp, err := http.Get(fwd.URL() + "/federate")
	require.NoError(t, err)
	sent, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(sent))
	require.Contains(t, string(sent), `_id="`+hashedID+`"`)
	require.NotContains(t, string(sent), fwdClusterID, "the raw id is not what was sent")
	require.Contains(t, string(sent), "\ncsv_succeeded{")
	for _, tense := range []string{"past", "present", "future"} { // the forwarder's timestamps are exact: kept
		require.Zero(t, metricsValue(t, recv.URL(), "phonehome_receive_upload_restamped_total", map[string]string{"tense": tense}), tense)
	}
	requireNoForwarderDrops(t, fwd)
}
