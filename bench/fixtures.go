// Package bench holds the fleet benchmark: the load generator (bench/fleet,
// bench/cmd/fleetgen), the scenario harness (bench/scenario, bench/cmd/benchrun),
// their fixtures and the recorded results (bench/results).
package bench

import _ "embed"

// FederateSample is one cluster's /federate response (300 series), copied from
// ../shared/fixtures/federate-sample.prom.
//
//go:embed testdata/federate-sample.prom
var FederateSample []byte

// TelemetryAllowlist is OpenShift's telemetry allowlist (211 selectors), copied
// from ../shared/fixtures/telemetry-allowlist.txt. It selects 224 series of
// FederateSample.
//
//go:embed testdata/telemetry-allowlist.txt
var TelemetryAllowlist []byte
