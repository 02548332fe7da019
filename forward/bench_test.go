package forward

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/bench"
)

// syntheticFederate returns a /federate body with n series: the fixture's 300
// series repeated with a distinguishing "shard" label (about 75% allowlisted).
func syntheticFederate(tb testing.TB, n int) []byte {
	tb.Helper()
	return syntheticBody(readFixture(tb, "federate-sample.prom"), n)
}

func syntheticBody(fixture []byte, n int) []byte {
	var lines [][]byte
	for _, l := range bytes.Split(fixture, []byte("\n")) {
		if len(l) > 0 && l[0] != '#' {
			lines = append(lines, l)
		}
	}
	var buf bytes.Buffer
	for i := 0; i < n; i++ {
		l := lines[i%len(lines)]
		shard := i / len(lines)
		j := bytes.IndexByte(l, '{')
		buf.Write(l[:j+1])
		fmt.Fprintf(&buf, "shard=\"%d\",", shard)
		buf.Write(l[j+1:])
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// BenchmarkCycle measures one federate-filter-anonymize-encode-queue cycle
// of the forwarder in steady state: HTTP over loopback, parsing, allowlist,
// relabel + HMAC (or the series cache's answers), remote-write 2.0 protobuf +
// snappy, and a fsynced queue append. One untimed cycle first fills the
// series cache, as the first cycle after a start does; BenchmarkCycleFirst
// measures such cycles, BenchmarkCycleUncached cycles without the cache.
//
// The fake Prometheus runs in a child process (this test binary re-executed,
// see serveFederateChild) and writes a body encoded before it starts listening
// with one Write, so neither its CPU nor its memory is counted here.
// cpu-ms/cycle is this process' CPU (user+sys, all threads: the cycle, the
// HTTP client, the GC it causes) over the timed loop divided by the cycles;
// the loop does nothing but cycles (the queue is not drained, it holds every
// cycle's records). maxrss-MiB is this process' peak RSS so far (run one size
// per process for a clean figure).
func BenchmarkCycle(b *testing.B) { benchmarkCycle(b, Options{}, false) }

// BenchmarkCycleFirst measures the first cycle under a policy, as after a
// start or a gathering definition change: the policy is set anew before
// every cycle, which drops the series cache, so every cycle parses every
// series' labels, runs the allowlist, relabeling and HMACs, and fills the
// cache.
func BenchmarkCycleFirst(b *testing.B) { benchmarkCycle(b, Options{}, true) }

// BenchmarkCycleUncached is BenchmarkCycle without the series cache
// (federate.cache_series: 0).
func BenchmarkCycleUncached(b *testing.B) { benchmarkCycle(b, Options{SeriesCacheSize: -1}, false) }

func benchmarkCycle(b *testing.B, opts Options, first bool) {
	// proto: the delimited protobuf exposition the forwarder negotiates first
	// (as Prometheus' /federate serves it).
	for _, format := range []string{"text", "proto"} {
		for _, n := range []int{1_000, 10_000, 100_000} {
			b.Run(fmt.Sprintf("format=%s/series=%d", format, n), func(b *testing.B) {
				promURL, bodyBytes := startFederateChild(b, format, n)
				q, err := OpenQueue(b.TempDir(), discardLogger(), nil, QueueOptions{MaxBytes: 1 << 30})
				require.NoError(b, err)
				defer q.Close()
				policy := fixturePolicy(b)
				src := NewFederator(mustURL(b, promURL), http.DefaultClient, FederateOptions{Matches: policy.Allow.Selectors()})
				f := New(discardLogger(), nil, src, policy, q, nil, opts)
				require.NoError(b, f.Collect(context.Background())) // untimed: the first cycle
				b.ReportAllocs()
				b.SetBytes(bodyBytes)
				runtime.GC() // the setup's garbage is not the cycles'
				cycles := 0
				cpu0 := bench.ProcessCPU()
				for b.Loop() {
					if first {
						require.NoError(b, f.SetPolicy(policy)) // a new *Policy
					}
					require.NoError(b, f.Collect(context.Background()))
					cycles++
				}
				cpu := bench.ProcessCPU() - cpu0
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(cycles), "cpu-ms/cycle")
				b.ReportMetric(float64(n*cycles)/b.Elapsed().Seconds(), "series/s")
				b.ReportMetric(bench.MaxRSSMiB(), "maxrss-MiB")
			})
		}
	}
}

// federateChildEnv, when set to "<format>:<series>" (format text or proto),
// makes TestMain serve a synthetic /federate body instead of running tests.
const federateChildEnv = "PHONEHOME_BENCH_FEDERATE"

// startFederateChild re-executes the test binary as a fake Prometheus serving
// a synthetic /federate body of n series in format. It returns the base URL
// and the body size. The child exits when the benchmark ends.
func startFederateChild(b *testing.B, format string, n int) (string, int64) {
	b.Helper()
	exe, err := os.Executable()
	require.NoError(b, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", federateChildEnv, format, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // closed at cleanup: the child's signal to exit
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	b.Cleanup(func() {
		_ = stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("fake prometheus: %v", err)
		}
	})
	var (
		addr string
		size int64
	)
	_, err = fmt.Fscanf(stdout, "%s %d\n", &addr, &size)
	require.NoError(b, err, "fake prometheus did not report its address")
	return "http://" + addr, size
}

// serveFederateChild is the child's side of startFederateChild: it encodes
// the body once, then serves it at /federate with a single Write per request
// until its stdin is closed.
func serveFederateChild(spec string) int {
	format, ns, _ := strings.Cut(spec, ":")
	n, err := strconv.Atoi(ns)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad", federateChildEnv, spec)
		return 2
	}
	fixture, err := os.ReadFile("../bench/testdata/federate-sample.prom")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	body, ct := syntheticBody(fixture, n), "text/plain; version=0.0.4"
	if format == "proto" {
		if body, ct, err = protoExposition(body); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("%s %d\n", ln.Addr(), len(body))
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
	return 0
}

// protoExposition converts a text exposition into the delimited protobuf one,
// families in name order, as Prometheus' /federate serves it.
func protoExposition(text []byte) ([]byte, string, error) {
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, "", err
	}
	format := expfmt.NewFormat(expfmt.TypeProtoDelim)
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, format)
	for _, n := range slices.Sorted(maps.Keys(fams)) {
		if err := enc.Encode(fams[n]); err != nil {
			return nil, "", err
		}
	}
	return buf.Bytes(), string(format), nil
}

// BenchmarkQueue measures sequential append (one fsync per batch of 16
// records) and read+ack throughput with 64 KiB records.
func BenchmarkQueue(b *testing.B) {
	rec := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB
	batch := make([][]byte, 16)
	for i := range batch {
		batch[i] = rec
	}
	b.Run("write", func(b *testing.B) {
		q, err := OpenQueue(b.TempDir(), discardLogger(), nil, QueueOptions{MaxBytes: 256 << 20})
		require.NoError(b, err)
		defer q.Close()
		b.ReportAllocs()
		b.SetBytes(int64(len(rec) * len(batch)))
		for b.Loop() {
			require.NoError(b, q.Append(batch...)) // drops oldest once full
		}
	})
	b.Run("read", func(b *testing.B) {
		q, err := OpenQueue(b.TempDir(), discardLogger(), nil, QueueOptions{MaxBytes: 1 << 30})
		require.NoError(b, err)
		defer q.Close()
		b.ReportAllocs()
		b.SetBytes(int64(len(rec)))
		for b.Loop() {
			b.StopTimer()
			if n, _ := q.Len(); n == 0 {
				require.NoError(b, q.Append(batch...))
			}
			b.StartTimer()
			_, pos, _, ok, err := q.Peek()
			require.NoError(b, err)
			require.True(b, ok)
			require.NoError(b, q.Ack(pos))
		}
	})
}
