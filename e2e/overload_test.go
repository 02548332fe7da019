package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestReceiverInflightLimitAndReadTimeout holds the real binary to its
// flags: with --receive.max-inflight-requests=1, a write arriving while
// another is being read gets 503 and Retry-After; --web.read-timeout ends
// the request whose body never completes, after which writes pass again.
func TestReceiverInflightLimitAndReadTimeout(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte("tokens:\n- token: t1\n  tenant: acme\n"), 0o600))
	cfg := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("auth:\n  tokens_file: tokens.yaml\n"), 0o600))
	recv := startReceiver(t, cfg, filepath.Join(dir, "data"), "--receive.max-inflight-requests=1", "--web.read-timeout=2s")

	// --receive.max-inflight-bytes is on by default (its gauge exists only then).
	require.GreaterOrEqual(t, metricValue(scrapeMetrics(t, recv.URL()), "phonehome_receive_inflight_bytes", nil), 0.0)

	// A write whose body never completes: its handler waits in the body.
	pw, slowDone := trickle(t, recv.URL(), -1)
	defer pw.Close()
	eventually(t, 10*time.Second, func() error {
		if v := metricValue(scrapeMetrics(t, recv.URL()), "phonehome_receive_inflight_requests", nil); v != 1 {
			return fmt.Errorf("in flight: %v", v)
		}
		return nil
	})

	write := encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels: labelsOf("__name__", "up", "_id", "c1"), Samples: []prompb.Sample{{Timestamp: time.Now().UnixMilli(), Value: 1}},
	}}})
	code, body, err := postWrite(http.DefaultClient, recv.URL(), "t1", write, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Equal(t, 1.0, metricValue(scrapeMetrics(t, recv.URL()), "phonehome_receive_overloaded_requests_total", map[string]string{"limit": "requests"}))

	// The read timeout ends the trickled request; then writes pass.
	select {
	case err := <-slowDone: // a 4xx answer or a closed connection: either ends it
		t.Logf("the trickled request ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("--web.read-timeout=2s did not end a request whose body never completed")
	}
	eventually(t, 10*time.Second, func() error {
		code, body, err := postWrite(http.DefaultClient, recv.URL(), "t1", write, nil)
		if err != nil || code != http.StatusNoContent {
			return fmt.Errorf("%d %s: %w", code, body, err)
		}
		return nil
	})
}

// TestReceiverInflightBytesLimit: with --receive.max-inflight-bytes, a
// write whose declared body is being read holds its size, and another write
// that would pass the limit meanwhile gets 503 with Retry-After; once the
// first ends, writes pass again and nothing stays reserved.
func TestReceiverInflightBytesLimit(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte("tokens:\n- token: t1\n  tenant: acme\n"), 0o600))
	cfg := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("auth:\n  tokens_file: tokens.yaml\n"), 0o600))
	recv := startReceiver(t, cfg, filepath.Join(dir, "data"), "--receive.max-inflight-bytes=65536")

	pw, slowDone := trickle(t, recv.URL(), 1<<20) // declares 1 MiB: reserved before it is read, alone
	eventually(t, 10*time.Second, func() error {
		if v := metricValue(scrapeMetrics(t, recv.URL()), "phonehome_receive_inflight_bytes", nil); v < 1<<20 {
			return fmt.Errorf("reserved: %v", v)
		}
		return nil
	})
	write := encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels: labelsOf("__name__", "up", "_id", "c1"), Samples: []prompb.Sample{{Timestamp: time.Now().UnixMilli(), Value: 1}},
	}}})
	req, err := http.NewRequest(http.MethodPost, recv.URL()+"/api/v1/write", bytes.NewReader(write))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("Authorization", "Bearer t1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, string(body))
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	require.Contains(t, string(body), "hold too much memory")
	require.Equal(t, 1.0, metricValue(scrapeMetrics(t, recv.URL()), "phonehome_receive_overloaded_requests_total", map[string]string{"limit": "bytes"}))

	pw.CloseWithError(io.ErrUnexpectedEOF) // the first write ends short
	select {
	case err := <-slowDone:
		t.Logf("the trickled request ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the trickled request did not end")
	}
	eventually(t, 10*time.Second, func() error {
		code, body, err := postWrite(http.DefaultClient, recv.URL(), "t1", write, nil)
		if err != nil || code != http.StatusNoContent {
			return fmt.Errorf("%d %s: %w", code, body, err)
		}
		return nil
	})
	require.Zero(t, metricValue(scrapeMetrics(t, recv.URL()), "phonehome_receive_inflight_bytes", nil))
}

// trickle starts a write as t1 whose body never completes (a first byte,
// then nothing) and returns its pipe and the end of its request.
// contentLength < 0 sends no Content-Length.
func trickle(t *testing.T, url string, contentLength int64) (*io.PipeWriter, <-chan error) {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, url+"/api/v1/write", pr)
	require.NoError(t, err)
	req.ContentLength = contentLength
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("Authorization", "Bearer t1")
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	_, _ = pw.Write([]byte{0xff}) // the body has begun
	return pw, done
}

// TestReceiverReadyDespiteAHangingBucket: a bucket that accepts connections
// and never answers must not keep ingest away for more than 30 s
// (README, /-/ready); until the bucket is listed, reads warn that its data
// is missing.
func TestReceiverReadyDespiteAHangingBucket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		var held []net.Conn // open, never answered, until the listener closes
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	dir := t.TempDir()
	secret := filepath.Join(dir, "s3-secret")
	require.NoError(t, os.WriteFile(secret, []byte("secret\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(fmt.Sprintf("tokens:\n- token: %q\n  tenant: acme\n  allow: [read, write]\n", pushToken)), 0o600))
	cfg := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`auth:
  tokens_file: tokens.yaml
storage:
  bucket:
    type: s3
    s3: {bucket: phonehome, endpoint: %s, region: us-east-1, access_key: a, secret_key_file: %s, insecure: true, bucket_lookup_type: path}
`, ln.Addr(), secret)), 0o600))

	start := time.Now()
	p := startBinary(t, "receiver", "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:0", "--log.format=json")
	defer p.Kill() // its shutdown would try to upload to the hanging bucket
	resp, err := http.Get(p.URL() + "/-/ready")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "ready before the bucket was listed or the grace ended")
	waitHTTP(t, p.URL()+"/-/ready", http.StatusOK)
	require.Less(t, time.Since(start), 50*time.Second)

	code, env, err := queryAPI(p.URL(), "up") // as pushToken
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, fmt.Sprint(env.Warnings), "the bucket has not been listed since the receiver started")
}
