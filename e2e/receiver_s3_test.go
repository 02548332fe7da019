package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/stretchr/testify/require"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/s3"
)

const (
	s3Bucket = "phonehome"
	s3Access = "phonehome-access"
	s3Secret = "phonehome-secret-key"
)

// TestReceiverShipsToS3 writes known samples for two tenants, stops the
// receiver (which flushes its heads and uploads the blocks) and reads the
// bucket back through S3 from versitygw: every block has a Thanos meta.json
// labelled with its tenant and the replica's external labels, opens with
// tsdb.OpenBlock, and all blocks together hold exactly the samples written.
func TestReceiverShipsToS3(t *testing.T) {
	dir := t.TempDir()
	s3Addr := startVersityGW(t, filepath.Join(dir, "s3"))
	secretFile := filepath.Join(dir, "s3-secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(s3Secret+"\n"), 0o600))
	cfg := writeReceiverConfig(t, dir, "", fmt.Sprintf(`  external_labels: {replica: r0, region: eu}
  ship_interval: 1h
  bucket:
    type: s3
    s3:
      bucket: %s
      endpoint: %s
      region: us-east-1
      access_key: %s
      secret_key_file: s3-secret # relative to the config file
      insecure: true
      bucket_lookup_type: path
`, s3Bucket, s3Addr, s3Access))
	rcv := startReceiver(t, cfg, filepath.Join(dir, "data"))

	// The samples straddle a 2h block boundary, so the flush cuts two blocks
	// per tenant. 15 s apart, 100 per series, in 10 requests of 10 each.
	boundary := time.Now().Add(-5 * time.Minute).Truncate(2 * time.Hour).UnixMilli()
	base := boundary - 750_000
	want := map[string]map[string][]sampleBits{}
	write := func(tenant, token string, nSeries int) {
		want[tenant] = map[string][]sampleBits{}
		for batch := range 10 {
			req := &prompb.WriteRequest{}
			for i := range nSeries {
				ls := labelsOf("__name__", "s3_test_samples", "series", fmt.Sprintf("%03d", i), "tenant_hint", tenant)
				ts := prompb.TimeSeries{Labels: ls}
				for j := batch * 10; j < batch*10+10; j++ {
					v := float64(i*1000+j) + 0.25
					switch {
					case i == 0 && j == 99:
						v = math.Float64frombits(value.StaleNaN) // must survive bit-exact
					case i == 1 && j == 50:
						v = math.Inf(-1)
					}
					ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: base + int64(j)*15_000, Value: v})
				}
				key := labelsKey(ls)
				for _, s := range ts.Samples {
					want[tenant][key] = append(want[tenant][key], sampleBits{s.Timestamp, math.Float64bits(s.Value)})
				}
				req.Timeseries = append(req.Timeseries, ts)
			}
			mustWrite(t, rcv.URL(), token, req)
		}
	}
	write("acme", tokenAcme, 50)
	write("other", tokenOther, 3)
	// SIGTERM, as Kubernetes sends it: flush the heads into blocks, upload
	// them, exit 0 (Stop then only checks the exit status).
	require.NoError(t, rcv.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-rcv.done:
	case <-time.After(90 * time.Second):
		t.Fatal("receiver did not exit within 90s of SIGTERM")
	}
	rcv.Stop()

	bkt := openS3(t, s3Addr)
	ctx := context.Background()
	var blocks []string
	require.NoError(t, bkt.Iter(ctx, "", func(name string) error {
		blocks = append(blocks, strings.TrimSuffix(name, "/"))
		return nil
	}))
	require.Len(t, blocks, 4, "two blocks per tenant: %v", blocks)

	got := map[string]map[string][]sampleBits{}
	for _, id := range blocks {
		local := filepath.Join(dir, "download", id)
		var objects []string
		require.NoError(t, bkt.Iter(ctx, id, func(name string) error {
			objects = append(objects, name)
			return nil
		}, objstore.WithRecursiveIter()))
		for _, name := range objects {
			downloadObject(t, bkt, name, filepath.Join(dir, "download", filepath.FromSlash(name)))
		}

		var meta blockMeta
		b, err := os.ReadFile(filepath.Join(local, "meta.json"))
		require.NoError(t, err, "block %s has no meta.json: %v", id, objects)
		require.NoError(t, json.Unmarshal(b, &meta))
		require.Equal(t, id, meta.ULID)
		tenant := meta.Thanos.Labels["tenant_id"]
		require.Contains(t, []string{"acme", "other"}, tenant)
		require.Equal(t, map[string]string{"tenant_id": tenant, "replica": "r0", "region": "eu"}, meta.Thanos.Labels, id)
		require.NotEmpty(t, meta.Thanos.Source, id)
		require.Equal(t, int64(0), meta.Thanos.Downsample.Resolution)
		require.True(t, meta.MinTime >= boundary || meta.MaxTime <= boundary, "block %s [%d,%d) crosses the 2h boundary %d", id, meta.MinTime, meta.MaxTime, boundary)
		// meta.json lists every other object of the block, with its size.
		var listed []string
		for _, f := range meta.Thanos.Files {
			if f.RelPath == "meta.json" {
				continue
			}
			listed = append(listed, path.Join(id, f.RelPath))
			st, err := os.Stat(filepath.Join(local, filepath.FromSlash(f.RelPath)))
			require.NoError(t, err)
			require.Equal(t, f.SizeBytes, st.Size(), f.RelPath)
		}
		require.ElementsMatch(t, listed, without(objects, path.Join(id, "meta.json")))

		if got[tenant] == nil {
			got[tenant] = map[string][]sampleBits{}
		}
		n := readBlock(t, local, got[tenant])
		require.Equal(t, meta.Stats.NumSamples, uint64(n), "block %s stats", id)
	}
	require.Equal(t, want, got)
}

// sampleBits is a sample with its value as bits, so NaNs compare exactly.
type sampleBits struct {
	T int64
	V uint64
}

// blockMeta is the part of a Thanos meta.json the test checks.
type blockMeta struct {
	ULID    string `json:"ulid"`
	MinTime int64  `json:"minTime"`
	MaxTime int64  `json:"maxTime"`
	Stats   struct {
		NumSamples uint64 `json:"numSamples"`
	} `json:"stats"`
	Thanos struct {
		Labels     map[string]string `json:"labels"`
		Source     string            `json:"source"`
		Downsample struct {
			Resolution int64 `json:"resolution"`
		} `json:"downsample"`
		Files []struct {
			RelPath   string `json:"rel_path"`
			SizeBytes int64  `json:"size_bytes"`
		} `json:"files"`
	} `json:"thanos"`
}

// readBlock opens the block in dir and appends all its float samples to
// into, keyed by series. It returns how many it read.
func readBlock(t *testing.T, dir string, into map[string][]sampleBits) int {
	t.Helper()
	b, err := tsdb.OpenBlock(slog.New(slog.DiscardHandler), dir, nil, nil)
	require.NoError(t, err)
	defer b.Close()
	q, err := tsdb.NewBlockQuerier(b, math.MinInt64, math.MaxInt64)
	require.NoError(t, err)
	defer q.Close()
	ss := q.Select(context.Background(), false, nil, labels.MustNewMatcher(labels.MatchRegexp, "__name__", ".+"))
	n := 0
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At()
		key := s.Labels().String()
		it = s.Iterator(it)
		for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
			require.Equal(t, chunkenc.ValFloat, vt, key)
			ts, v := it.At()
			into[key] = append(into[key], sampleBits{ts, math.Float64bits(v)})
			n++
		}
		require.NoError(t, it.Err())
	}
	require.NoError(t, ss.Err())
	return n
}

// labelsKey renders prompb labels as labels.Labels.String() does.
func labelsKey(ls []prompb.Label) string {
	b := labels.NewScratchBuilder(len(ls))
	for _, l := range ls {
		b.Add(l.Name, l.Value)
	}
	b.Sort()
	return b.Labels().String()
}

func without(list []string, drop string) []string {
	var out []string
	for _, s := range list {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}

func downloadObject(t *testing.T, bkt objstore.Bucket, name, dst string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	r, err := bkt.Get(context.Background(), name)
	require.NoError(t, err, name)
	defer r.Close()
	f, err := os.Create(dst)
	require.NoError(t, err)
	_, err = io.Copy(f, r)
	require.NoError(t, errors.Join(err, f.Close()))
}

// startVersityGW runs versitygw's posix backend in root on a loopback port,
// with the test bucket created as a directory, and returns host:port.
func startVersityGW(t *testing.T, root string) string {
	t.Helper()
	bin := versityGWPath(t)
	require.NoError(t, os.MkdirAll(filepath.Join(root, s3Bucket), 0o755))
	addr := freeAddr(t)
	p := startProcess(t, bin, "versitygw", []string{
		"--access", s3Access, "--secret", s3Secret, "--port", addr, "--quiet", "--health", "/health",
		"posix", root,
	}, func(string) (string, bool) {
		return addr, true // --quiet logs one line at start; readiness is polled below
	})
	waitHTTP(t, p.URL()+"/health", http.StatusOK)
	return addr
}

// versityGWPath finds versitygw on PATH or in GOPATH/bin, where
// `go install` puts it. CI installs it; its absence is a failure.
func versityGWPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	require.NoError(t, err)
	for _, gp := range filepath.SplitList(strings.TrimSpace(string(out))) {
		p := filepath.Join(gp, "bin", "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("versitygw not found on PATH or in $(go env GOPATH)/bin: go install github.com/versity/versitygw/cmd/versitygw@v1.8.0")
	return ""
}

// openS3 is a client for the test bucket, independent of the receiver's.
func openS3(t *testing.T, addr string) objstore.Bucket {
	t.Helper()
	cfg := s3.DefaultConfig
	cfg.Bucket, cfg.Endpoint, cfg.Region, cfg.Insecure = s3Bucket, addr, "us-east-1", true
	cfg.AccessKey, cfg.SecretKey = s3Access, s3Secret
	cfg.BucketLookupType = s3.PathLookup
	bkt, err := s3.NewBucketWithConfig(nopKitLogger{}, cfg, "e2e", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = bkt.Close() })
	return bkt
}

// nopKitLogger satisfies the go-kit logger interface objstore's s3 wants.
type nopKitLogger struct{}

func (nopKitLogger) Log(...any) error { return nil }
