package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noEnv(string) string { return "" }

// recorder is a push endpoint that records what it got.
type recorder struct {
	mu       sync.Mutex
	requests int
	path     string
	auth     string
	fams     []*dto.MetricFamily
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.requests++
	rc.path, rc.auth = r.URL.EscapedPath(), r.Header.Get("Authorization")
	dec := expfmt.NewDecoder(r.Body, expfmt.ResponseFormat(r.Header))
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); err != nil {
			if !errors.Is(err, io.EOF) {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			break
		}
		rc.fams = append(rc.fams, mf)
	}
	w.WriteHeader(http.StatusOK)
}

func TestPushSendsCountersWithLabels(t *testing.T) {
	rc := &recorder{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	c := New(Options{URL: srv.URL, Token: "tok", Grouping: map[string]string{"source": "ci/nightly", "z": "1"}, Getenv: noEnv})
	require.True(t, c.Enabled())
	c.Counter("cluster_installation_invocation", "h").
		AddLabelValue("platform", "aws").AddLabelValue("result", "success").
		AddDuration("duration", 23*time.Minute+10*time.Second)
	c.Counter("cluster_installation_modification", "h").AddLabelValue("asset", "install-config").SetValue(2)
	require.NoError(t, c.Push(context.Background()))

	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Equal(t, 1, rc.requests)
	require.Equal(t, "Bearer tok", rc.auth)
	require.Equal(t, "/metrics/job/installer/source@base64/Y2kvbmlnaHRseQ/z/1", rc.path)
	for value, want := range map[string]string{".": "/metrics/job/installer/v@base64/Lg", "..": "/metrics/job/installer/v@base64/Li4", "": "/metrics/job/installer/v@base64/="} {
		c := New(Options{URL: "http://x", Grouping: map[string]string{"v": value}, Getenv: noEnv})
		require.Equal(t, "http://x"+want, c.url(), "%q: a path segment no server cleans away", value)
	}
	require.Len(t, rc.fams, 2)
	inv := rc.fams[0]
	require.Equal(t, "cluster_installation_invocation", inv.GetName())
	require.Equal(t, dto.MetricType_COUNTER, inv.GetType())
	require.Equal(t, 1.0, inv.GetMetric()[0].GetCounter().GetValue())
	got := map[string]string{}
	for _, lp := range inv.GetMetric()[0].GetLabel() {
		got[lp.GetName()] = lp.GetValue()
	}
	require.Equal(t, map[string]string{"platform": "aws", "result": "success", "duration": "25"}, got)
	require.Equal(t, 2.0, rc.fams[1].GetMetric()[0].GetCounter().GetValue())
}

func TestDurationBucket(t *testing.T) {
	step := DefaultDurationStep
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0"}, {-time.Second, "0"}, {time.Second, "2.5"}, {150 * time.Second, "2.5"},
		{151 * time.Second, "5"}, {23*time.Minute + 10*time.Second, "25"}, {25 * time.Minute, "25"},
	} {
		require.Equal(t, tc.want, DurationBucket(tc.d, step), tc.d.String())
	}
	require.Equal(t, "1", DurationBucket(10*time.Second, time.Minute))
}

func TestPushReturnsWithinTimeout(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)

	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer failing.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())

	// A transport that ignores the context entirely.
	stuck := &http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
		<-release
		return nil, errors.New("released")
	})}

	for _, tc := range []struct {
		name, url string
		hc        *http.Client
		want      string
	}{
		{"slow server", slow.URL, nil, "deadline exceeded"},
		{"server down", down, nil, "connection refused"},
		{"server error", failing.URL, nil, "500"},
		{"transport ignores cancellation", "http://127.0.0.1:1", stuck, "deadline exceeded"},
		{"panicking transport", "http://127.0.0.1:1", &http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
			panic("transport bug")
		})}, "panic: transport bug"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Options{URL: tc.url, Timeout: 200 * time.Millisecond, HTTPClient: tc.hc, Getenv: noEnv})
			c.Counter("cluster_installation_invocation", "h").AddLabelValue("result", "success")
			pushed := make(chan error, 1)
			go func() { pushed <- c.Push(context.Background()) }()
			select {
			case err := <-pushed:
				require.Error(t, err)
				require.Contains(t, err.Error(), tc.want)
			case <-time.After(time.Minute): // a stuck transport or server would hold it for good
				t.Fatal("push did not return after its timeout")
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestDisabledSendsNothing(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"env 1", Options{URL: srv.URL, Getenv: func(k string) string { return map[string]string{EnvDisabled: "1"}[k] }}},
		{"env true", Options{URL: srv.URL, Getenv: func(k string) string { return map[string]string{EnvDisabled: "TRUE"}[k] }}},
		{"option", Options{URL: srv.URL, Disabled: true, Getenv: noEnv}},
		{"no url", Options{Getenv: noEnv}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(tc.opts)
			require.False(t, c.Enabled())
			c.Counter("cluster_installation_invocation", "h").AddLabelValue("result", "success")
			require.NoError(t, c.Push(context.Background()))
		})
	}
	for _, v := range []string{"", "0", "false"} {
		require.True(t, New(Options{URL: srv.URL, Getenv: func(string) string { return v }}).Enabled(), v)
	}
	require.Zero(t, hits.Load())

	var nilClient *Client
	nilClient.Counter("x", "h").AddLabelValue("a", "b").SetValue(3).AddDuration("d", time.Minute)
	require.NoError(t, nilClient.Push(context.Background()))
}
