package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/receive"
	"github.com/phonehome/phonehome/storage"
)

// recorder keeps what a write stores.
type recorder struct{ series []prompb.TimeSeries }

func (r *recorder) Write(_ context.Context, _ string, series []prompb.TimeSeries) (storage.Stats, error) {
	r.series = append(r.series, series...)
	return storage.Stats{Samples: len(series)}, nil
}

// setupHashingAuth builds cfg's auth, which has a cluster_id_hash, and
// returns it with the pseudonym of raw.
func setupHashingAuth(t *testing.T, cfg receive.AuthConfig, raw string) (authSetup, string) {
	t.Helper()
	a, err := setupAuth(slog.New(slog.DiscardHandler), nil, cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	hasher, err := auth.LoadClusterIDHasher(cfg.ClusterIDHash.SecretFile)
	if err != nil {
		t.Fatal(err)
	}
	return a, hasher.Pseudonym(raw)
}

// fleetHashingConfig is an auth config with /authorize (a keys file), one
// fleet token "fleet" of tenant acme (allow: [authorize]), and a
// cluster_id_hash whose pseudonyms setting is pseudonyms.
func fleetHashingConfig(t *testing.T, pseudonyms string) receive.AuthConfig {
	t.Helper()
	write := fileWriter(t, t.TempDir())
	write("k1.pem", ed25519PEM(t))
	cfg := receive.AuthConfig{
		TokensFile:    write("tokens.yaml", "tokens:\n  - token: fleet\n    tenant: acme\n    allow: [authorize]\n"),
		KeysFile:      write("keys.yaml", "keys:\n- kid: k1\n  created: 2026-01-01T00:00:00Z\n  private_key_file: k1.pem\n"),
		ClusterIDHash: &receive.ClusterIDHashConfig{SecretFile: write("key", "0123456789abcdef0123"), Pseudonyms: pseudonyms},
	}
	cfg.SetDefaults()
	return cfg
}

// fileWriter returns a function that writes a file in dir and returns its path.
func fileWriter(t *testing.T, dir string) func(name, content string) string {
	return func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// With auth.cluster_id_hash, a tokens file may bind a token to the raw
// cluster id (README). A write with such a token must store the pseudonym,
// never the raw id: the series' raw _id is rewritten, a missing one added
// as the pseudonym.
func TestStaticTokenBoundToRawIDWritesPseudonym(t *testing.T) {
	const raw = "0f2c6b3e-6d0e-4e7b-9a51-2d6f1c9b8a77"
	write := fileWriter(t, t.TempDir())
	cfg := receive.AuthConfig{
		TokensFile:    write("tokens.yaml", "tokens:\n  - token: cluster-writer\n    tenant: acme\n    cluster_id: "+raw+"\n    allow: [write]\n"),
		ClusterIDHash: &receive.ClusterIDHashConfig{SecretFile: write("key", "0123456789abcdef0123")},
	}
	a, pseudonym := setupHashingAuth(t, cfg, raw)

	rec := &recorder{}
	var lcfg limits.Config
	lcfg.SetDefaults()
	h := auth.Middleware(a.authn, auth.PermWrite, nil,
		receive.NewHandler(slog.New(slog.DiscardHandler), nil, rec, limits.New(nil, lcfg, nil), receive.Options{}))
	for _, ls := range [][]prompb.Label{
		{{Name: "__name__", Value: "up"}},
		{{Name: "__name__", Value: "up"}, {Name: "_id", Value: raw}, {Name: "job", Value: "b"}},
	} {
		body, err := (&prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{Labels: ls, Samples: []prompb.Sample{{Value: 1, Timestamp: 1000}}}}}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/api/v1/write", bytes.NewReader(snappy.Encode(nil, body)))
		r.Header.Set("Content-Type", "application/x-protobuf")
		r.Header.Set("Content-Encoding", "snappy")
		r.Header.Set("Authorization", "Bearer cluster-writer")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusNoContent {
			t.Fatalf("write %v: %d %s", ls, w.Code, w.Body)
		}
	}
	if len(rec.series) != 2 {
		t.Fatalf("stored %d series, want 2", len(rec.series))
	}
	for _, ts := range rec.series {
		for _, l := range ts.Labels {
			if strings.Contains(l.Value, raw) {
				t.Errorf("stored %v: the raw cluster id", ts.Labels)
			}
			if l.Name == "_id" && l.Value != pseudonym {
				t.Errorf("stored _id %q, want the pseudonym %q", l.Value, pseudonym)
			}
		}
	}
}

// auth.cluster_id_hash.pseudonyms: refuse reaches both places a cluster
// claims an id: /authorize answers 400 and Telemeter's write path 401 for
// a pseudonym-shaped id (another cluster's stored _id, say), and both
// still take a raw id.
func TestPseudonymsRefuseIsWired(t *testing.T) {
	const raw = "0f2c6b3e-6d0e-4e7b-9a51-2d6f1c9b8a77"
	a, stored := setupHashingAuth(t, fleetHashingConfig(t, receive.PseudonymsRefuse), raw)

	authorize := func(id string) int {
		r := httptest.NewRequest(http.MethodPost, "/authorize?id="+id, nil)
		r.Header.Set("Authorization", "Bearer fleet")
		w := httptest.NewRecorder()
		a.authorize.ServeHTTP(w, r)
		return w.Code
	}
	if got := authorize(stored); got != http.StatusBadRequest {
		t.Errorf("/authorize with a stored id: %d, want 400", got)
	}
	if got := authorize(raw); got != http.StatusOK {
		t.Errorf("/authorize with a raw id: %d, want 200", got)
	}

	telemeter := auth.Middleware(a.telemeter, auth.PermWrite, nil,
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	telemeterWrite := func(id string) int {
		r := httptest.NewRequest(http.MethodPost, "/metrics/v1/receive", nil)
		r.Header.Set("Authorization", "Bearer "+base64.StdEncoding.EncodeToString([]byte(`{"authorization_token":"fleet","cluster_id":"`+id+`"}`)))
		w := httptest.NewRecorder()
		telemeter.ServeHTTP(w, r)
		return w.Code
	}
	if got := telemeterWrite(stored); got != http.StatusUnauthorized {
		t.Errorf("telemeter write with a stored id: %d, want 401", got)
	}
	if got := telemeterWrite(raw); got != http.StatusNoContent {
		t.Errorf("telemeter write with a raw id: %d, want 204", got)
	}
}
