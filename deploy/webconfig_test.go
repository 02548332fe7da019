package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/webtls"
	"github.com/phonehome/phonehome/webtls/webtlstest"
)

// TestWebConfigExample validates deploy/web-config.yaml as the receiver
// does at start, with its certificate paths pointed at files made here.
func TestWebConfigExample(t *testing.T) {
	b, err := os.ReadFile("web-config.yaml")
	require.NoError(t, err)
	ca := webtlstest.NewCA(t, "example")
	cert, key := ca.Server(t, "receiver")
	y := strings.NewReplacer(
		"/etc/phonehome/tls/tls.crt", cert,
		"/etc/phonehome/tls/tls.key", key,
		"/etc/phonehome/tls/clients-ca.crt", ca.File,
	).Replace(string(b))
	require.NotEqual(t, string(b), y, "the example's paths changed: update this test")
	p := filepath.Join(t.TempDir(), "web-config.yaml")
	require.NoError(t, os.WriteFile(p, []byte(y), 0o600))
	require.NoError(t, webtls.ValidateWebConfig(p, webtls.ServerOptions{}))
}
