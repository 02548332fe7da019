package limits

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// decode parses a receiver-style file strictly, as the receiver does.
func decode(t *testing.T, in string) (Config, error) {
	t.Helper()
	var file struct {
		Limits Config `yaml:"limits"`
	}
	dec := yaml.NewDecoder(bytes.NewReader([]byte(in)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, err
	}
	return file.Limits, nil
}

func TestConfigOverridesInheritDefaults(t *testing.T) {
	cfg, err := decode(t, `
limits:
  defaults:
    max_series_per_cluster: 20000
    series_idle_timeout: 1h
  tenants:
    acme:
      max_series_per_cluster: 0        # unlimited, not "unset"
      samples_per_second_per_cluster: 50
      max_body_bytes: 1MiB
    beta: {}
`)
	require.NoError(t, err)
	cfg.SetDefaults()
	require.NoError(t, cfg.Validate())
	l := New(nil, cfg, nil)

	def := DefaultTenantLimits()
	def.MaxSeriesPerCluster = 20000
	def.SeriesIdleTimeout = time.Hour
	require.Equal(t, def, l.For("unknown"), "no override: defaults")
	require.Equal(t, def, l.For("beta"), "empty override: defaults")

	acme := def
	acme.MaxSeriesPerCluster = 0
	acme.SamplesPerSecondPerCluster = 50
	acme.MaxBodyBytes = 1 << 20
	require.Equal(t, acme, l.For("acme"), "set keys override, the rest inherit")
}

func TestConfigEmptyIsBuiltinDefaults(t *testing.T) {
	cfg, err := decode(t, "")
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.Equal(t, DefaultTenantLimits(), New(nil, cfg, nil).For("x"))

	cfg.SetDefaults()
	require.NotNil(t, cfg.Defaults.MaxDecodedBytes)
	require.Equal(t, DefaultTenantLimits(), New(nil, cfg, nil).For("x"), "SetDefaults only makes them explicit")
	again := cfg
	again.SetDefaults()
	require.Equal(t, cfg, again, "idempotent")
}

func TestConfigStrict(t *testing.T) {
	_, err := decode(t, "limits:\n  defaults:\n    max_series_per_clustr: 1\n")
	require.ErrorContains(t, err, "max_series_per_clustr")
	_, err = decode(t, "limits:\n  tenants:\n    acme:\n      bogus: 1\n")
	require.ErrorContains(t, err, "bogus")
	_, err = decode(t, "limits:\n  defaults:\n    max_body_bytes: lots\n")
	require.Error(t, err)
}

func TestConfigValidateNamesEveryPath(t *testing.T) {
	cfg, err := decode(t, `
limits:
  defaults:
    max_series_per_cluster: -1
    max_label_value_length: -5
    samples_per_second_per_tenant: -3
    series_idle_timeout: 0s
  tenants:
    acme:
      burst_per_cluster: 0
      max_body_bytes: 64MiB
    "a.b":
      max_series_per_metric: -2
    ok:
      samples_per_second_per_cluster: 0
      burst_per_cluster: 0
`)
	require.NoError(t, err)
	err = cfg.Validate()
	require.Error(t, err)
	want := []string{
		"limits.defaults.max_series_per_cluster: must not be negative (0 = unlimited), got -1",
		"limits.defaults.max_label_value_length: must not be negative (0 = unlimited), got -5",
		"limits.defaults.samples_per_second_per_tenant: must be a finite number >= 0 (0 = unlimited), got -3",
		"limits.defaults.series_idle_timeout: must be at least 1s, got 0s",
		`limits.tenants."a.b".max_series_per_metric: must not be negative (0 = unlimited), got -2`,
		"limits.tenants.acme.burst_per_cluster: must be at least 1 when the rate is limited, got 0",
		"limits.tenants.acme.max_decoded_bytes: 32MiB must be at least max_body_bytes (64MiB)",
	}
	require.Equal(t, strings.Join(want, "\n"), err.Error())
}
