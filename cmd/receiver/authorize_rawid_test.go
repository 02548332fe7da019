package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/golang/snappy"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/receive"
)

// With auth.cluster_id_hash, telemeter-client authorizes with its raw id
// and writes with the credential it gets, which binds the pseudonym. The
// raw id must not be stored on those writes either: a label value that
// contains it is stored with the pseudonym in its place, and an _id equal
// to it is rewritten (not refused as another cluster's), on /upload as on
// /api/v1/write, as on Telemeter's bearer path, which carries the raw id.
func TestAuthorizedRawIDIsRewrittenOnEveryWritePath(t *testing.T) {
	const raw = "0f2c6b3e-6d0e-4e7b-9a51-2d6f1c9b8a77"
	a, pseudonym := setupHashingAuth(t, fleetHashingConfig(t, receive.PseudonymsAccept), raw)

	r := httptest.NewRequest(http.MethodPost, "/authorize?id="+raw, nil)
	r.Header.Set("Authorization", "Bearer fleet")
	w := httptest.NewRecorder()
	a.authorize.ServeHTTP(w, r)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var authorized auth.AuthorizeResponse
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &authorized))
	require.Equal(t, pseudonym, authorized.ClusterID)

	rec := &recorder{}
	var lcfg limits.Config
	lcfg.SetDefaults()
	h := receive.NewHandler(slog.New(slog.DiscardHandler), nil, rec, limits.New(nil, lcfg, nil), receive.Options{})
	console := "https://console-openshift-console.apps." + raw + ".example.com"

	for _, tc := range []struct {
		path    string
		handler http.Handler
		body    []byte
		headers map[string]string
		code    int
	}{
		{"/upload", http.HandlerFunc(h.ServeUpload), uploadBody(t,
			family("console_url", "url", console),
			family("cluster_version", "_id", raw, "version", "4.18.1"),
		), map[string]string{
			"Content-Type":     "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited",
			"Content-Encoding": "snappy",
		}, http.StatusOK},
		{"/api/v1/write", h, remoteWriteBody(t,
			[]prompb.Label{{Name: "__name__", Value: "console_url"}, {Name: "url", Value: console}},
			[]prompb.Label{{Name: "__name__", Value: "cluster_version"}, {Name: "_id", Value: raw}, {Name: "version", Value: "4.18.1"}},
		), map[string]string{"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}, http.StatusNoContent},
	} {
		t.Run(tc.path, func(t *testing.T) {
			rec.series = nil
			r := httptest.NewRequest(http.MethodPost, tc.path, bytes.NewReader(tc.body))
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			r.Header.Set("Authorization", "Bearer "+authorized.Token)
			w := httptest.NewRecorder()
			auth.Middleware(a.authn, auth.PermWrite, nil, tc.handler).ServeHTTP(w, r)
			for _, ts := range rec.series {
				for _, l := range ts.Labels {
					require.NotContains(t, l.Value, raw, "stored %v", ts.Labels)
				}
			}
			require.Equal(t, tc.code, w.Code, "the raw _id is the cluster's own: %s", w.Body)
			require.Len(t, rec.series, 2)
			got := map[string]string{}
			for _, ts := range rec.series {
				ls := map[string]string{}
				for _, l := range ts.Labels {
					ls[l.Name] = l.Value
				}
				require.Equal(t, pseudonym, ls["_id"])
				got[ls["__name__"]] = ls["url"] + ls["version"]
			}
			require.Equal(t, map[string]string{
				"console_url":     "https://console-openshift-console.apps." + pseudonym + ".example.com",
				"cluster_version": "4.18.1",
			}, got)
		})
	}
}

// family is a gauge family of one metric with the label pairs.
func family(name string, pairs ...string) *dto.MetricFamily {
	m := &dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(1)}}
	for i := 0; i+1 < len(pairs); i += 2 {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(pairs[i]), Value: proto.String(pairs[i+1])})
	}
	return &dto.MetricFamily{Name: proto.String(name), Type: dto.MetricType_GAUGE.Enum(), Metric: []*dto.Metric{m}}
}

// uploadBody is telemeter-client's upload of fams: delimited MetricFamily
// protobufs in snappy's framing format.
func uploadBody(t *testing.T, fams ...*dto.MetricFamily) []byte {
	t.Helper()
	var b bytes.Buffer
	sw := snappy.NewBufferedWriter(&b)
	for _, f := range fams {
		_, err := protodelim.MarshalTo(sw, f)
		require.NoError(t, err)
	}
	require.NoError(t, sw.Close())
	return b.Bytes()
}

// remoteWriteBody is a remote-write 1.0 request of one sample per series.
func remoteWriteBody(t *testing.T, series ...[]prompb.Label) []byte {
	t.Helper()
	req := &prompb.WriteRequest{}
	for _, ls := range series {
		req.Timeseries = append(req.Timeseries, prompb.TimeSeries{Labels: ls, Samples: []prompb.Sample{{Value: 1, Timestamp: 1000}}})
	}
	b, err := req.Marshal()
	require.NoError(t, err)
	return snappy.Encode(nil, b)
}
