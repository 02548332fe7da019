package upstream_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/upstream"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  upstream.Config
		errs []string
	}{
		{name: "disabled", cfg: upstream.Config{}},
		{name: "valid", cfg: upstream.Config{URL: "https://mimir:8080/api/v1/push", Mode: "forward_only", TenantHeader: "X-Scope-OrgID"}},
		{name: "settings without url", cfg: upstream.Config{BearerTokenFile: "tok"}, errs: []string{"upstream.url: required"}},
		{name: "fixed tenant", cfg: upstream.Config{URL: "http://thanos:19291/api/v1/receive", TenantHeader: "THANOS-TENANT", Tenant: "FB870BF3-9F3A-44FF-9BF7-D7A047A52F43"}},
		{name: "fixed tenant without header", cfg: upstream.Config{URL: "http://thanos:19291/api/v1/receive", Tenant: "t"}, errs: []string{"upstream.tenant: needs tenant_header"}},
		{
			name: "bad values",
			cfg:  upstream.Config{URL: "ftp://x", Mode: "mirror", Queue: upstream.QueueConfig{MaxBytes: 10}},
			errs: []string{`upstream.url: "ftp://x" is not an http(s) URL`, `upstream.mode: "mirror"`, "upstream.queue.max_bytes"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.SetDefaults()
			err := tc.cfg.Validate()
			if len(tc.errs) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, e := range tc.errs {
				require.Contains(t, err.Error(), e)
			}
		})
	}
}
