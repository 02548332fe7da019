package noisy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/receive"
	"github.com/phonehome/phonehome/storage"
)

// blockingWriter holds every write until release is closed.
type blockingWriter struct {
	entered chan struct{}
	release chan struct{}
}

func (w blockingWriter) Write(ctx context.Context, _ string, series []prompb.TimeSeries) (storage.Stats, error) {
	w.entered <- struct{}{}
	select {
	case <-w.release:
	case <-ctx.Done():
	}
	n := 0
	for _, s := range series {
		n += len(s.Samples)
	}
	return storage.Stats{Samples: n}, nil
}

// TestInflightCapThroughHandler: a cluster with max_inflight_requests_per_cluster
// requests in flight gets 429 with Retry-After for one more, before its body
// is read; another cluster is not affected; once one finishes it may write again.
func TestInflightCapThroughHandler(t *testing.T) {
	const capacity = 2
	w := blockingWriter{entered: make(chan struct{}, 8), release: make(chan struct{})}
	n := capacity
	lim := limits.New(nil, limits.Config{Defaults: limits.Spec{MaxInflightRequestsPerCluster: &n}}, nil)
	tokens, err := auth.NewTokens([]auth.TokenEntry{
		{Token: "calm", Tenant: "acme", ClusterID: "calm"},
		{Token: "noisy", Tenant: "acme", ClusterID: "noisy"},
	})
	require.NoError(t, err)
	h := receive.NewHandler(slog.New(slog.DiscardHandler), nil, w, lim, receive.Options{})
	srv := httptest.NewServer(auth.Middleware(tokens, auth.PermWrite, nil, h))
	defer srv.Close()

	payload, err := body("up", 1, 1000, "")
	require.NoError(t, err)
	codes := make(chan int, capacity)
	for range capacity {
		go func() {
			code, err := post(srv.URL, "noisy", payload)
			if err != nil {
				code = -1
			}
			codes <- code
		}()
	}
	for range capacity {
		<-w.entered // both requests are inside the handler
	}

	// One more, over a raw connection that announces 1 MiB of body and
	// sends none: the answer can only come before the body is read.
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprint(conn, "POST /api/v1/write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer noisy\r\n"+
		"Content-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\nContent-Length: 1048576\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	require.Contains(t, string(msg), "max_inflight_requests_per_cluster limit of 2")

	calmDone := make(chan int, 1)
	go func() {
		code, _ := post(srv.URL, "calm", payload)
		calmDone <- code
	}()
	<-w.entered // the calm cluster's request is not refused: it reaches storage

	close(w.release)
	for range capacity {
		require.Equal(t, http.StatusNoContent, <-codes)
	}
	require.Equal(t, http.StatusNoContent, <-calmDone)
	code, err := post(srv.URL, "noisy", payload)
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, code, "slots freed")
}
