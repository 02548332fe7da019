package forward

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/forward/telemetertest"
)

// telemeter-server refuses a whole upload for one sample older than 24h
// (400: the batch would be dropped) or one label value over 255 bytes (500:
// the batch would be retried for ever). telemeter-client leaves such
// samples out before it uploads; so does the sender.
func TestTelemeterSenderLeavesOutWhatTheServerRefuses(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	srv.MaxAge = 24 * time.Hour // telemeter-server's
	reg := prometheus.NewRegistry()
	_, s := newTelemeterPair(t, srv, reg)
	now := time.Now().UnixMilli()
	dayAgo := now - (25 * time.Hour).Milliseconds()
	series := func(name string, ls []prompb.Label, ts ...int64) prompb.TimeSeries {
		out := prompb.TimeSeries{Labels: append([]prompb.Label{{Name: "__name__", Value: name}}, ls...)}
		for _, t := range ts {
			out.Samples = append(out.Samples, prompb.Sample{Value: 1, Timestamp: t})
		}
		return out
	}
	req := &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		series("up", []prompb.Label{{Name: "job", Value: "a"}}, dayAgo, now),
		series("up", []prompb.Label{{Name: "job", Value: strings.Repeat("x", 256)}}, now),
		series("up", []prompb.Label{{Name: strings.Repeat("l", 256), Value: "v"}}, now),
		series(strings.Repeat("n", 256), nil, now),
		series("cluster_version", []prompb.Label{{Name: "version", Value: strings.Repeat("4", 255)}}, now),
	}}

	require.NoError(t, s.Send(context.Background(), req))
	require.Empty(t, srv.Rejections())
	require.Equal(t, 2, srv.Samples(), "the fresh sample of job a, and a value of exactly 255 bytes")
	require.Equal(t, 4.0, testutil.ToFloat64(s.unsendable), "the old sample, a long value, a long label name, a long metric name")
}

func TestTelemeterSenderNoMaxAge(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	a, _ := newTelemeterPair(t, srv, nil)
	s := NewTelemeterSender(srv.URL+"/upload", srv.Client(), a, TelemeterSenderOptions{MaxAge: -1})
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	require.NoError(t, s.Send(context.Background(), telemeterBatch(old)))
	require.Equal(t, 4, srv.Samples(), "without MaxAge every sample is sent")
}

// TestTelemeterSenderMaxAgeDefault: unset, MaxAge is telemeter-client's
// 24 hours, not "no limit".
func TestTelemeterSenderMaxAgeDefault(t *testing.T) {
	require.Equal(t, 24*time.Hour, NewTelemeterSender("", nil, nil, TelemeterSenderOptions{}).opts.MaxAge)
	require.Equal(t, time.Duration(-1), NewTelemeterSender("", nil, nil, TelemeterSenderOptions{MaxAge: -1}).opts.MaxAge)
}
