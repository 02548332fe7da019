package forward

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/forward/telemetertest"
	"github.com/phonehome/phonehome/webtls"
	"github.com/phonehome/phonehome/webtls/webtlstest"
)

const telemeterHashedID = "sUTqYf4UzU0SdM5NcdUhdA"

func telemeterBatch(now int64) *prompb.WriteRequest {
	return &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		{
			Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: telemeterHashedID}, {Name: "job", Value: "b"}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: now - 1000}, {Value: 0, Timestamp: now}},
		},
		{
			Labels:  []prompb.Label{{Name: "__name__", Value: "up"}, {Name: "_id", Value: telemeterHashedID}, {Name: "job", Value: "a"}},
			Samples: []prompb.Sample{{Value: 1, Timestamp: now - 2000}},
		},
		{
			Labels:  []prompb.Label{{Name: "__name__", Value: "cluster_version"}, {Name: "_id", Value: telemeterHashedID}, {Name: "version", Value: "4.19.0"}},
			Samples: []prompb.Sample{{Value: 3, Timestamp: now - 500}},
		},
	}}
}

func TestTelemeterFamilies(t *testing.T) {
	req := telemeterBatch(10_000)
	req.Timeseries = append(req.Timeseries,
		prompb.TimeSeries{Labels: []prompb.Label{{Name: "job", Value: "nameless"}}, Samples: []prompb.Sample{{Value: 1, Timestamp: 1}}},
		prompb.TimeSeries{Labels: []prompb.Label{{Name: "__name__", Value: "native"}}, Histograms: []prompb.Histogram{{Timestamp: 1}}},
	)
	fams, skipped := TelemeterFamilies(req, map[string]string{"_id": "bound", "region": "eu"})
	require.Equal(t, 2, skipped, "one nameless sample, one native histogram")
	require.Len(t, fams, 2)
	require.Equal(t, "cluster_version", fams[0].GetName())
	require.Equal(t, "up", fams[1].GetName())
	require.Equal(t, dto.MetricType_UNTYPED, fams[1].GetType())
	// Every sample is a metric with its own timestamp, in timestamp order.
	var ts []int64
	var jobs []string
	for _, m := range fams[1].GetMetric() {
		ts = append(ts, m.GetTimestampMs())
		labels := map[string]string{}
		var names []string
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
			names = append(names, l.GetName())
		}
		require.IsNonDecreasing(t, names)
		require.Equal(t, "bound", labels["_id"], "the authorize answer's labels replace ours")
		require.Equal(t, "eu", labels["region"])
		require.NotContains(t, labels, "__name__")
		jobs = append(jobs, labels["job"])
	}
	require.Equal(t, []int64{8000, 9000, 10_000}, ts)
	require.Equal(t, []string{"a", "b", "b"}, jobs)
	require.Equal(t, 0.0, fams[1].GetMetric()[2].GetUntyped().GetValue())
}

func newTelemeterPair(t *testing.T, srv *telemetertest.Server, reg prometheus.Registerer) (*Authorizer, *TelemeterSender) {
	t.Helper()
	base, err := url.Parse(srv.URL)
	require.NoError(t, err)
	authURL, err := TelemeterAuthorizeURL(base, "", telemeterHashedID)
	require.NoError(t, err)
	a := NewAuthorizer(slog.New(slog.DiscardHandler), reg, base, srv.Client(), AuthorizerOptions{
		Mode: AuthorizeAlways, Token: "fleet", ClusterID: telemeterHashedID, URL: authURL,
	})
	// A short upload window: the injected 429s below have no Retry-After,
	// as telemeter-server's limiter sends none, so the sender waits it.
	s := NewTelemeterSender(srv.URL+"/upload", srv.Client(), a, TelemeterSenderOptions{Registerer: reg, RateLimit: time.Second, MaxAge: DefaultTelemeterMaxAge})
	return a, s
}

func TestTelemeterSenderWireFormatAndReauthorize(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	srv.MaxAge = time.Hour
	reg := prometheus.NewRegistry()
	a, s := newTelemeterPair(t, srv, reg)
	ctx := context.Background()
	now := time.Now().UnixMilli()

	require.NoError(t, s.Send(ctx, telemeterBatch(now)))
	require.Equal(t, []string{telemeterHashedID}, srv.AuthorizeIDs(), "only the hashed id is sent")
	require.Equal(t, 4, srv.Samples())
	var got []int64
	for _, mf := range srv.Families() {
		for _, m := range mf.GetMetric() {
			got = append(got, m.GetTimestampMs())
		}
	}
	require.ElementsMatch(t, []int64{now - 500, now - 2000, now - 1000, now}, got, "original timestamps")

	// The token expires at the server: the upload gets 401, the sender
	// re-authorizes once and the same batch goes through.
	srv.Expire()
	require.NoError(t, s.Send(ctx, telemeterBatch(now)))
	require.Len(t, srv.AuthorizeIDs(), 2)
	require.Equal(t, 8, srv.Samples())
	require.Equal(t, 1.0, testutil.ToFloat64(a.rejected))
	require.Equal(t, []string{"401 invalid token"}, srv.Rejections(), "only the expired token was refused")
}

func TestTelemeterSenderStatuses(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	_, s := newTelemeterPair(t, srv, nil)
	ctx := context.Background()
	now := time.Now().UnixMilli()
	for _, tc := range []struct {
		code      int
		retryable bool
	}{
		{http.StatusInternalServerError, true},
		{http.StatusServiceUnavailable, true},
		{http.StatusTooManyRequests, true},
		{http.StatusBadRequest, false},
		{http.StatusForbidden, false},
		{http.StatusRequestEntityTooLarge, false},
	} {
		srv.FailNext(tc.code)
		err := s.Send(ctx, telemeterBatch(now))
		require.Error(t, err, "%d", tc.code)
		var re RetryableError
		require.Equal(t, tc.retryable, errors.As(err, &re), "%d: %v", tc.code, err)
		var he *HTTPError
		require.ErrorAs(t, err, &he)
		require.Equal(t, tc.code, he.Code)
	}
	// 401 again right after re-authorizing: kept queued.
	srv.FailNext(http.StatusUnauthorized, http.StatusUnauthorized)
	var re RetryableError
	require.ErrorAs(t, s.Send(ctx, telemeterBatch(now)), &re)

	// The server's own validation: a sample older than its max age is 400.
	srv.MaxAge = time.Minute
	err := s.Send(ctx, telemeterBatch(now-int64(time.Hour/time.Millisecond)))
	var he *HTTPError
	require.ErrorAs(t, err, &he)
	require.Equal(t, http.StatusBadRequest, he.Code)
	require.False(t, errors.As(err, &re))
}

func TestTelemeterSenderAuthorizeFailureIsRetryable(t *testing.T) {
	srv := telemetertest.NewServer("another-fleet-token")
	defer srv.Close()
	_, s := newTelemeterPair(t, srv, nil)
	err := s.Send(context.Background(), telemeterBatch(time.Now().UnixMilli()))
	var re RetryableError
	require.ErrorAs(t, err, &re)
	require.ErrorIs(t, err, ErrAuthorize)
	require.Zero(t, srv.Uploads())
}

func TestTelemeterAuthorizeURL(t *testing.T) {
	base, _ := url.Parse("https://infogw.example.com/base/")
	u, err := TelemeterAuthorizeURL(base, "", telemeterHashedID)
	require.NoError(t, err)
	require.Equal(t, "https://infogw.example.com/base/authorize?id="+telemeterHashedID, u)
	// --to-auth is used as given, except that a raw id in it is replaced.
	u, err = TelemeterAuthorizeURL(base, "https://auth.example.com/authorize?id=raw-cluster-id&x=1", telemeterHashedID)
	require.NoError(t, err)
	require.Equal(t, "https://auth.example.com/authorize?id="+telemeterHashedID+"&x=1", u)
}

// fleetEndpoint answers /authorize like our receiver (ours) or a stock
// telemeter-server, and counts hits per path.
type fleetEndpoint struct {
	mu   sync.Mutex
	hits map[string]int
}

func (f *fleetEndpoint) count(p string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[p]
}

func newFleetEndpoint(t *testing.T, authorize func(w http.ResponseWriter)) (*fleetEndpoint, *httptest.Server) {
	f := &fleetEndpoint{hits: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.hits[r.URL.Path]++
		f.mu.Unlock()
		switch r.URL.Path {
		case "/authorize":
			authorize(w)
		case "/api/v1/write":
			w.Header().Set("X-Prometheus-Remote-Write-Samples-Written", "4")
			w.WriteHeader(http.StatusNoContent)
		case "/upload":
			w.WriteHeader(http.StatusOK)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return f, srv
}

func TestProtocolSenderAutoFollowsTheAuthorizeAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
		want   string
	}{
		{"our receiver", func(w http.ResponseWriter) {
			_ = json.NewEncoder(w).Encode(map[string]any{
				"token": "c", "expires_in_seconds": 3600, "tenant": "t", "cluster_id": telemeterHashedID,
				"version": 1, "expiresInSeconds": 3600, "labels": map[string]string{"_id": telemeterHashedID},
			})
		}, "/api/v1/write"},
		{"stock telemeter-server", func(w http.ResponseWriter) {
			_ = json.NewEncoder(w).Encode(map[string]any{
				"version": 1, "token": "c", "expiresInSeconds": 3600, "labels": map[string]string{"_id": telemeterHashedID},
			})
		}, "/upload"},
		{"no /authorize", func(w http.ResponseWriter) { http.Error(w, "404 page not found", http.StatusNotFound) }, "/api/v1/write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFleetEndpoint(t, tc.answer)
			base, _ := url.Parse(srv.URL)
			reg := prometheus.NewRegistry()
			a := NewAuthorizer(slog.New(slog.DiscardHandler), reg, base, srv.Client(), AuthorizerOptions{Token: "fleet", ClusterID: telemeterHashedID})
			ps := NewProtocolSender(ProtocolSenderOptions{
				Protocol: ProtocolAuto, Authorizer: a, Registerer: reg,
				RemoteWrite: NewHTTPSender(base, srv.Client(), HTTPSenderOptions{Credentials: a, Version: VersionV1}),
				Telemeter:   NewTelemeterSender(srv.URL+"/upload", srv.Client(), a, TelemeterSenderOptions{}),
			})
			_, err := ps.SendRecord(context.Background(), mustRecord(t, telemeterBatch(time.Now().UnixMilli())))
			require.NoError(t, err)
			require.Equal(t, 1, f.count(tc.want))
			require.Equal(t, 1, f.count("/api/v1/write")+f.count("/upload"))
			proto := ProtocolRemoteWrite
			if tc.want == "/upload" {
				proto = ProtocolTelemeter
			}
			require.Equal(t, 1.0, testutil.ToFloat64(ps.inUse.WithLabelValues(proto)))
		})
	}
}

func mustRecord(t *testing.T, req *prompb.WriteRequest) Record {
	t.Helper()
	body, err := EncodeWriteRequest(req)
	require.NoError(t, err)
	return Record{Proto: ProtoV1, Body: body, Samples: countSamples(req)}
}

func TestInlineBearerAndClientCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := webtlstest.NewCA(t, "test").Client(t, "telemeter-client")

	var gotAuth, gotCN string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		if len(r.TLS.PeerCertificates) > 0 {
			gotCN = r.TLS.PeerCertificates[0].Subject.CommonName
		}
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	caFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))

	cert, err := webtls.ClientCertificate(certFile, keyFile)
	require.NoError(t, err)
	client, err := NewHTTPClient(caFile, cert, nil)
	require.NoError(t, err)
	WithBearerToken(client, "inline")
	resp, err := client.Get(srv.URL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, "Bearer inline", gotAuth)
	require.Equal(t, "telemeter-client", gotCN)
	client.CloseIdleConnections()

	_, err = NewHTTPClient(filepath.Join(dir, "missing"), cert, nil)
	require.ErrorContains(t, err, "missing", "a CA file that cannot be read fails at start")
}

// telemeter-server passes its authorizer's 404 ("not found") on at
// /authorize, and has no /api/v1/write. Auto takes the 404 for "no
// /authorize" and writes directly; the write's 404 then says it is not our
// receiver: the batch stays queued (it was dropped as a 4xx) and /authorize
// is asked again.
func TestProtocolSenderAutoKeepsTheBatchWhenNeitherEndpointExists(t *testing.T) {
	var mu sync.Mutex
	hits := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path]++
		mu.Unlock()
		if r.URL.Path == "/authorize" {
			http.Error(w, "not found", http.StatusNotFound) // pkg/authorize.AgainstEndpoint's answer
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	base, _ := url.Parse(srv.URL)
	a := NewAuthorizer(slog.New(slog.DiscardHandler), nil, base, srv.Client(), AuthorizerOptions{Token: "fleet", ClusterID: telemeterHashedID})
	ps := NewProtocolSender(ProtocolSenderOptions{
		Protocol: ProtocolAuto, Authorizer: a,
		RemoteWrite: NewHTTPSender(base, srv.Client(), HTTPSenderOptions{Credentials: a, Version: VersionV1}),
		Telemeter:   NewTelemeterSender(srv.URL+"/upload", srv.Client(), a, TelemeterSenderOptions{}),
	})
	for attempt := 1; attempt <= 2; attempt++ {
		_, err := ps.SendRecord(context.Background(), mustRecord(t, telemeterBatch(time.Now().UnixMilli())))
		var re RetryableError
		require.ErrorAs(t, err, &re, "kept queued: %v", err)
		var he *HTTPError
		require.ErrorAs(t, err, &he)
		require.Equal(t, http.StatusNotFound, he.Code)
		mu.Lock()
		require.Equal(t, attempt, hits["/authorize"], "asked again before each attempt")
		mu.Unlock()
	}
}
