package forward

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// syntheticFederate returns a /federate body with n series: the fixture's 300
// series repeated with a distinguishing "shard" label (about 75% allowlisted).
func syntheticFederate(tb testing.TB, n int) []byte {
	tb.Helper()
	var lines [][]byte
	for _, l := range bytes.Split(readFixture(tb, "federate-sample.prom"), []byte("\n")) {
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

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func maxRSSMiB() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Maxrss) / 1024 // Linux reports KiB
}

// BenchmarkCycle measures one federate-filter-anonymize-encode-queue cycle:
// HTTP over loopback, parsing, allowlist, relabel + HMAC, protobuf + snappy,
// and a fsynced queue append. cpu-ms/cycle includes the in-process fake
// Prometheus serving the body; maxrss-MiB is the process peak so far (run one
// size per process for a clean figure).
func BenchmarkCycle(b *testing.B) {
	// proto: the delimited protobuf exposition the forwarder negotiates first
	// (as Prometheus' /federate serves it), encoded once so the fake server
	// only writes bytes.
	for _, format := range []string{"text", "proto"} {
		for _, n := range []int{1_000, 10_000, 100_000} {
			b.Run(fmt.Sprintf("format=%s/series=%d", format, n), func(b *testing.B) {
				body := syntheticFederate(b, n)
				prom := fakeStaticPrometheus(b, body, format == "proto")
				q, err := OpenQueue(b.TempDir(), discardLogger(), nil, QueueOptions{MaxBytes: 1 << 30})
				require.NoError(b, err)
				defer q.Close()
				policy := fixturePolicy(b)
				src := NewFederator(mustURL(b, prom.URL), http.DefaultClient, FederateOptions{Matches: policy.Allow.Selectors()})
				f := New(discardLogger(), nil, src, policy, q, nil, Options{})
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				var cpu time.Duration
				cycles := 0
				for b.Loop() {
					cpu0 := cpuTime()
					require.NoError(b, f.Collect(context.Background()))
					cpu += cpuTime() - cpu0 // the queue drain below is not part of a cycle
					cycles++
					b.StopTimer()
					drainQueue(b, q)
					b.StartTimer()
				}
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(cycles), "cpu-ms/cycle")
				b.ReportMetric(float64(n*cycles)/b.Elapsed().Seconds(), "series/s")
				b.ReportMetric(maxRSSMiB(), "maxrss-MiB")
			})
		}
	}
}

func drainQueue(tb testing.TB, q *Queue) {
	for {
		_, pos, _, ok, err := q.Peek()
		require.NoError(tb, err)
		if !ok {
			return
		}
		require.NoError(tb, q.Ack(pos))
	}
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

// fakeStaticPrometheus serves body at /federate, as text or, when proto is
// set, converted once to the delimited protobuf exposition.
func fakeStaticPrometheus(b *testing.B, body []byte, proto bool) *httptest.Server {
	b.Helper()
	ct := "text/plain; version=0.0.4"
	if proto {
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := tp.TextToMetricFamilies(bytes.NewReader(body))
		require.NoError(b, err)
		format := expfmt.NewFormat(expfmt.TypeProtoDelim)
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, format)
		names := make([]string, 0, len(fams))
		for n := range fams {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			require.NoError(b, enc.Encode(fams[n]))
		}
		body, ct = buf.Bytes(), string(format)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ct)
		_, _ = w.Write(body)
	}))
	b.Cleanup(srv.Close)
	return srv
}
