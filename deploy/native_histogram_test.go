package deploy

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/stretchr/testify/require"
)

// The receiver exports its write latency as a classic and a native
// histogram, and a Prometheus that scrapes native histograms keeps only the
// native one by default: PhonehomeReceiverSlowWrites must fire on either.
// (promtool 2.42's unit tests cannot load native histograms, so this runs
// the alert's expression in Prometheus' PromQL test language.)
func TestSlowWritesReadsNativeHistograms(t *testing.T) {
	alerts := readPrometheusRule(t, filepath.Join(kubeDir, "monitoring/receiver-alerts.yaml"))
	var expr string
	for _, g := range alerts.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "PhonehomeReceiverSlowWrites" {
				expr = strings.Join(strings.Fields(r.Expr), " ")
			}
		}
	}
	require.NotEmpty(t, expr)

	// Schema 0: bucket i holds (2^(i-1), 2^i]. Every write of the slow
	// replica takes 2–4 s (bucket 2), every write of the other 0.5–1 s.
	promqltest.RunTest(t, `
load 1m
  phonehome_receive_request_duration_seconds{job="phonehome-receiver-headless",namespace="ns",pod="slow"} {{schema:0 sum:0 count:0}}+{{schema:0 sum:300 count:100 buckets:[100] offset:2}}x20
  phonehome_receive_request_duration_seconds{job="phonehome-receiver-headless",namespace="ns",pod="fast"} {{schema:0 sum:0 count:0}}+{{schema:0 sum:75 count:100 buckets:[100]}}x20

eval instant at 15m count(`+expr+`) by (pod)
  {pod="slow"} 1
`, promqltest.NewTestEngine(t, false, 0, 100000))
}
