// Package webtls is TLS for our HTTP listeners and clients.
//
// Listeners (the receiver's and the forwarder's) take a web configuration
// file in the Prometheus exporter-toolkit format (--web.config.file, as
// Prometheus, Alertmanager and the exporters do): a server certificate,
// client-certificate authentication (mTLS), minimum and maximum TLS
// versions, cipher suites and curves, extra response headers. The file and
// the certificates it names are re-read on every new connection, so a
// rotated certificate is served without a restart. Without a file a
// listener serves plain HTTP, as it always did.
//
// Clients (the forwarder towards the receiver and Prometheus, a receiver
// towards its peers) describe their TLS with a ClientConfig.
package webtls

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"

	"github.com/prometheus/exporter-toolkit/web"
	"go.yaml.in/yaml/v3"
)

// ServerOptions are what a binary allows in its web config file.
type ServerOptions struct {
	// BasicAuth allows basic_auth_users. The receiver refuses them: its API
	// authenticates with bearer tokens in the same Authorization header,
	// so a request could never satisfy both.
	BasicAuth bool
}

// ValidateWebConfig checks the web config file at path as a listener would
// read it (YAML with no unknown key, certificate and key files, client CA,
// client_auth_type, TLS versions, cipher suites and curves, basic auth
// hashes), for a start-up and --check-config. An empty path is valid
// (plain HTTP).
func ValidateWebConfig(path string, opts ServerOptions) error {
	if path == "" {
		return nil
	}
	if !opts.BasicAuth {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("web config %s: %w", path, err)
		}
		var c struct {
			Users map[string]any `yaml:"basic_auth_users"`
		}
		if err := yaml.Unmarshal(b, &c); err == nil && len(c.Users) > 0 {
			return fmt.Errorf("web config %s: basic_auth_users: not supported here: the API authenticates with bearer tokens in the same Authorization header (use client certificates for transport authentication)", path)
		}
	}
	if err := web.Validate(path); err != nil {
		return fmt.Errorf("web config %s: %w", path, err)
	}
	return nil
}

// Serve serves srv on ln until srv is shut down (then it returns
// http.ErrServerClosed, like http.Server.Serve). With an empty path it is
// srv.Serve(ln): plain HTTP. Otherwise the exporter-toolkit serves it as the
// file says: TLS when it has a tls_server_config (certificates re-read on
// each new connection), plain HTTP when it has none. Validate the file
// first with ValidateWebConfig: Serve fails on a file it cannot use.
func Serve(ln net.Listener, srv *http.Server, path string, logger *slog.Logger) error {
	if path == "" {
		return srv.Serve(ln)
	}
	err := web.Serve(ln, srv, &web.FlagConfig{WebConfigFile: &path}, logger)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("web config %s: %w", path, err)
	}
	return err
}
