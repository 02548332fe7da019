package push

import (
	"bytes"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/phonehome/phonehome/auth"
)

// FuzzPushRequest: the path parser, the body decoders (text and delimited
// protobuf) and the validation never panic, refuse with a classified
// rejection, and whatever they accept is a record the state can take:
// finite values, valid label names, bounded sizes.
func FuzzPushRequest(f *testing.F) {
	const proto = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
	for _, s := range []struct{ path, ct, body string }{
		{"/metrics/job/i", "", counterText},
		{"/metrics/job@base64/YS9i/os@base64/=", "text/plain; version=0.0.4", "# TYPE installs_total counter\ninstalls_total 1\n"},
		{"/metrics/job/i", "", "# TYPE install_seconds histogram\ninstall_seconds_bucket{le=\"1\"} 1\ninstall_seconds_bucket{le=\"+Inf\"} 2\ninstall_seconds_sum 3\ninstall_seconds_count 2\n"},
		{"/metrics/job/i", "", "# TYPE temperature gauge\ntemperature{_id=\"c1\"} -1e308\n"},
		{"/metrics/job/i", proto, "\x1c\n\x0einstalls_total\x18\x00\"\x08\x1a\x06\t\x00\x00\x00\x00\x00\x00\xf0?"},
		{"/metrics/job/i/a/b/", "application/x-www-form-urlencoded", "installs_total 1\n"},
	} {
		f.Add(s.path, s.ct, []byte(s.body))
	}
	cfg := testConfig()
	cfg.MaxBodyBytes = 64 << 10
	g := &Gateway{cfg: cfg, allowed: map[string]bool{}}
	for _, n := range cfg.AllowedMetrics {
		g.allowed[n] = true
	}
	id := auth.Identity{Tenant: "acme", ClusterID: "c1"}
	f.Fuzz(func(t *testing.T, path, ct string, body []byte) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "?# \t\r\n") {
			return // not a request path
		}
		req, err := http.NewRequest(http.MethodPost, "http://x"+path, bytes.NewReader(body))
		if err != nil {
			return
		}
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		rec, err := g.parse(req, id)
		if err != nil {
			var rj *rejection
			if !errors.As(err, &rj) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		if len(rec.Samples) > cfg.MaxSeriesPerPush {
			t.Fatalf("%d samples accepted, limit %d", len(rec.Samples), cfg.MaxSeriesPerPush)
		}
		for _, d := range rec.Samples {
			if math.IsNaN(d.Value) || math.IsInf(d.Value, 0) {
				t.Fatalf("non-finite value accepted: %v %v", d.Labels, d.Value)
			}
			if d.Labels.Get("_id") != "c1" {
				t.Fatalf("series without the credential's _id: %v", d.Labels)
			}
			if d.Labels.Len() > cfg.MaxLabelsPerSeries+2 { // + __name__, le
				t.Fatalf("%d labels accepted: %v", d.Labels.Len(), d.Labels)
			}
			d.Labels.Range(func(l labels.Label) {
				if !model.LegacyValidation.IsValidLabelName(l.Name) || l.Value == "" {
					t.Fatalf("invalid label %q=%q accepted", l.Name, l.Value)
				}
			})
			if !model.LegacyValidation.IsValidMetricName(d.Labels.Get(model.MetricNameLabel)) {
				t.Fatalf("invalid metric name accepted: %v", d.Labels)
			}
		}
	})
}
