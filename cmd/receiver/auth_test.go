package main

import (
	"bytes"
	"context"
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

// With auth.cluster_id_hash, a tokens file may bind a token to the raw
// cluster id (README). A write with such a token must store the pseudonym,
// never the raw id: the series' raw _id is rewritten, a missing one added
// as the pseudonym.
func TestStaticTokenBoundToRawIDWritesPseudonym(t *testing.T) {
	const raw = "0f2c6b3e-6d0e-4e7b-9a51-2d6f1c9b8a77"
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := receive.AuthConfig{
		TokensFile:    write("tokens.yaml", "tokens:\n  - token: cluster-writer\n    tenant: acme\n    cluster_id: "+raw+"\n    allow: [write]\n"),
		ClusterIDHash: &receive.ClusterIDHashConfig{SecretFile: write("key", "0123456789abcdef0123")},
	}
	a, err := setupAuth(slog.New(slog.DiscardHandler), nil, cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	hasher, err := auth.LoadClusterIDHasher(cfg.ClusterIDHash.SecretFile)
	if err != nil {
		t.Fatal(err)
	}
	pseudonym := hasher.Pseudonym(raw)

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
