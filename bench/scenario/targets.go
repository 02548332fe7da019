package scenario

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Target is a remote-write server under test. Implementations start it in a
// fresh directory and, after the load, leave its data as blocks to measure.
type Target interface {
	Name() string
	Version() string
	// Start starts the server with its state under dir.
	// onPID, if not nil, is called with the server's process id as soon as
	// it runs (before it is ready), e.g. to sample its memory during a WAL
	// replay. Start on a directory of a previous Start reuses its data.
	Start(ctx context.Context, dir string, onPID func(int)) (*Running, error)
}

// protocolsTarget is a Target that decodes only some remote-write versions
// ("1.0", "2.0"); others decode both.
type protocolsTarget interface {
	Protocols() []string
}

// Running is a started target.
type Running struct {
	srv      *server
	WriteURL string
	Args     []string
	// StoredSamples, if set, returns the samples the server holds, for a
	// server without TSDB blocks (VictoriaMetrics); it is called after the
	// load, before Finish.
	StoredSamples func(ctx context.Context) (int64, error)
	// Finish makes the server's data durable as blocks, stops it, and
	// returns the directory holding the blocks ("" for a server without
	// blocks: StoredSamples is then the check). It must stop the server even
	// on error.
	Finish func(ctx context.Context) (blocksDir string, stopTook time.Duration, err error)
}

// Receiver is the phonehome receiver binary with a tokens file and the
// default filesystem bucket.
type Receiver struct {
	Bin   string
	Token string
	// OutOfOrderWindow is storage.out_of_order_window (default 6h).
	OutOfOrderWindow string
	// ExtraArgs are appended to the command line (e.g. --web.enable-pprof).
	ExtraArgs []string
	// Env is added to the environment (e.g. GOGC=50).
	Env []string
}

func (r *Receiver) Name() string { return "receiver" }

// Version is the commit that was HEAD when the binary was built (its
// modification time): others may commit while a long run goes on.
func (r *Receiver) Version() string {
	rev := "HEAD"
	if fi, err := os.Stat(r.Bin); err == nil {
		if out, err := exec.Command("git", "rev-list", "-1", "--before=@"+strconv.FormatInt(fi.ModTime().Unix(), 10), "HEAD").Output(); err == nil && len(out) > 0 {
			rev = strings.TrimSpace(string(out))
		}
	}
	out, err := exec.Command("git", "rev-parse", "--short", rev).Output()
	if err != nil {
		return "unknown"
	}
	return "phonehome@" + strings.TrimSpace(string(out))
}

func (r *Receiver) Start(ctx context.Context, dir string, onPID func(int)) (*Running, error) {
	// The tenant and per-metric series limits (5M, 1M by default) would
	// refuse series of the 10k-cluster catch-up: the benchmark measures
	// throughput, so they are off, as Prometheus has none.
	cfg := "auth:\n  tokens_file: tokens.yaml\nstorage:\n  out_of_order_window: " + cmp.Or(r.OutOfOrderWindow, "6h") + "\n  bucket:\n    type: filesystem\n" +
		"limits:\n  defaults:\n    max_series_per_tenant: 0\n    max_series_per_metric: 0\n"
	tokens := fmt.Sprintf("tokens:\n  - token: %q\n    tenant: \"bench\"\n", r.Token)
	if err := os.WriteFile(filepath.Join(dir, "receiver.yaml"), []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokens), 0o600); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	args := []string{
		"--config.file=" + filepath.Join(dir, "receiver.yaml"),
		"--storage.path=" + data,
		"--web.listen-address=127.0.0.1:0",
		"--log.format=json",
	}
	args = append(args, r.ExtraArgs...)
	srv, err := startServer(ctx, "receiver", r.Bin, args, filepath.Join(dir, "receiver.log"), "", true, onPID, r.Env)
	if err != nil {
		return nil, err
	}
	return &Running{
		srv: srv, WriteURL: srv.baseURL + "/api/v1/write", Args: append([]string{r.Bin}, args...),
		Finish: func(context.Context) (string, time.Duration, error) {
			// SIGTERM flushes the head to a block and uploads it.
			took, err := srv.stop(10 * time.Minute)
			if err != nil {
				return "", took, fmt.Errorf("receiver shutdown: %w", err)
			}
			return filepath.Join(data, "bucket"), took, nil
		},
	}, nil
}

// Prometheus is Debian's Prometheus with the remote-write receiver enabled.
// Its head is turned into a block by an admin-API snapshot.
type Prometheus struct {
	Bin string
}

func (p *Prometheus) Name() string { return "prometheus" }

// Protocols: Prometheus 2.42 decodes remote-write 1.0 only.
func (p *Prometheus) Protocols() []string { return []string{"1.0"} }

func (p *Prometheus) Version() string {
	out, err := exec.Command(p.Bin, "--version").CombinedOutput()
	if err != nil {
		return "unknown"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first)
}

func (p *Prometheus) Start(ctx context.Context, dir string, onPID func(int)) (*Running, error) {
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte("global:\n  scrape_interval: 1m\n"), 0o600); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	args := []string{
		"--config.file=" + cfg,
		"--storage.tsdb.path=" + data,
		"--web.listen-address=" + addr,
		"--web.enable-remote-write-receiver",
		"--web.enable-admin-api",
		"--log.format=json",
	}
	srv, err := startServer(ctx, "prometheus", p.Bin, args, filepath.Join(dir, "prometheus.log"), addr, false, onPID, nil)
	if err != nil {
		return nil, err
	}
	return &Running{
		srv: srv, WriteURL: srv.baseURL + "/api/v1/write", Args: append([]string{p.Bin}, args...),
		Finish: func(ctx context.Context) (string, time.Duration, error) {
			start := time.Now()
			name, snapErr := snapshot(ctx, srv.baseURL)
			_, stopErr := srv.stop(5 * time.Minute)
			took := time.Since(start)
			if snapErr != nil {
				return "", took, snapErr
			}
			if stopErr != nil {
				return "", took, fmt.Errorf("prometheus shutdown: %w", stopErr)
			}
			return filepath.Join(data, "snapshots", name), took, nil
		},
	}, nil
}

// snapshot asks Prometheus to write its head and blocks to a snapshot.
func snapshot(ctx context.Context, base string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/admin/tsdb/snapshot?skip_head=false", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("snapshot: %s: %s", resp.Status, body)
	}
	var out struct {
		Data struct {
			Name string `json:"name"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.Data.Name == "" {
		return "", fmt.Errorf("snapshot: unexpected response %q", body)
	}
	return out.Data.Name, nil
}

// headSeries sums prometheus_tsdb_head_series from the server's /metrics.
func headSeries(ctx context.Context, base, _ string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return SumMetric(ctx, base, "prometheus_tsdb_head_series")
}

// ErrNoMetric: the metric is not exposed.
var ErrNoMetric = errors.New("metric not exposed")

// SumMetric sums every sample of the metric name (all its label sets) in
// base/metrics; ErrNoMetric when there is none.
func SumMetric(ctx context.Context, base, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
			found = true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%w: no %s in %s/metrics", ErrNoMetric, name, base)
	}
	return sum, nil
}

// VictoriaMetrics is Debian's single-node VictoriaMetrics
// (/usr/bin/victoria-metrics, 1.79 in bookworm). It takes remote-write 1.0
// only: the scenario sends it 1.0 bodies of the same load (Protocols).
// It has no TSDB blocks to measure: Finish flushes its in-memory rows, and
// StoredSamples reads the rows it holds from its own metrics.
type VictoriaMetrics struct {
	Bin string
}

func (v *VictoriaMetrics) Name() string { return "victoriametrics" }

// Protocols are the remote-write versions it decodes.
func (v *VictoriaMetrics) Protocols() []string { return []string{"1.0"} }

func (v *VictoriaMetrics) Version() string {
	out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", "victoria-metrics").Output()
	if err != nil || len(out) == 0 {
		return "victoria-metrics (version unknown)"
	}
	return "victoria-metrics " + strings.TrimSpace(string(out)) + " (Debian)"
}

func (v *VictoriaMetrics) Start(ctx context.Context, dir string, onPID func(int)) (*Running, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	args := []string{
		"-storageDataPath=" + data,
		"-httpListenAddr=" + addr,
		// Samples are up to a day old in the storage scenario; the default
		// (1 month) would do, a year leaves no doubt.
		"-retentionPeriod=1y",
	}
	srv, err := startServer(ctx, "victoriametrics", v.Bin, args, filepath.Join(dir, "victoriametrics.log"), addr, false, onPID, nil)
	if err != nil {
		return nil, err
	}
	return &Running{
		srv: srv, WriteURL: srv.baseURL + "/api/v1/write", Args: append([]string{v.Bin}, args...),
		StoredSamples: func(ctx context.Context) (int64, error) { return vmStoredRows(ctx, srv.baseURL) },
		Finish: func(context.Context) (string, time.Duration, error) {
			took, err := srv.stop(5 * time.Minute)
			if err != nil {
				return "", took, fmt.Errorf("victoriametrics shutdown: %w", err)
			}
			return "", took, nil
		},
	}, nil
}

// vmStoredRows flushes VictoriaMetrics' buffered rows to parts and returns
// the rows its storage holds (vm_rows of storage/small and storage/big, plus
// any still pending).
func vmStoredRows(ctx context.Context, base string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/internal/force_flush", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("force_flush: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("force_flush: %s", resp.Status)
	}
	var n float64
	for _, name := range []string{`vm_rows{type="storage/small"}`, `vm_rows{type="storage/big"}`, `vm_pending_rows{type="storage"}`} {
		v, err := metricValue(ctx, base, name)
		if err != nil {
			return 0, err
		}
		n += v
	}
	return int64(n), nil
}

// metricValue reads the sample named exactly name (with its labels as
// exposed) from base/metrics.
func metricValue(ctx context.Context, base, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s in %s/metrics", name, base)
}
