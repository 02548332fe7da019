package forward

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/forward/telemetertest"
)

// telemeter-server takes one upload per cluster per --ratelimit and answers
// 429 to the others. Once it has, the sender waits out the window before
// each upload instead of being refused again: every refusal would count as
// a failed send in federate_requests_failed_total.
func TestTelemeterSenderKeepsToTheServerRateLimit(t *testing.T) {
	const window = 2 * time.Second
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	srv.RateLimit = window
	a, _ := newTelemeterPair(t, srv, nil)
	s := NewTelemeterSender(srv.URL+"/upload", srv.Client(), a, TelemeterSenderOptions{RateLimit: window})
	ctx := context.Background()
	now := time.Now().UnixMilli()

	first := time.Now()
	require.NoError(t, s.Send(ctx, telemeterBatch(now)))
	err := s.Send(ctx, telemeterBatch(now))
	var re RetryableError
	require.ErrorAs(t, err, &re, "the limiter's 429 keeps the batch queued")
	var he *HTTPError
	require.ErrorAs(t, err, &he)
	require.Equal(t, http.StatusTooManyRequests, he.Code)
	require.Greater(t, re.RetryAfter, time.Duration(0), "told to wait out the window")
	require.LessOrEqual(t, re.RetryAfter, window)

	// The forwarder retries at once here: the sender waits instead of
	// being refused, and so does every upload after it.
	require.NoError(t, s.Send(ctx, telemeterBatch(now)))
	require.GreaterOrEqual(t, time.Since(first), window)
	require.NoError(t, s.Send(ctx, telemeterBatch(now)))
	require.Len(t, srv.Rejections(), 1, "one 429, then none: %v", srv.Rejections())
	require.Equal(t, 12, srv.Samples())
}

// A wait is cut short by the context (shutdown), and is not a failure of
// the server.
func TestTelemeterSenderPacingStopsWithTheContext(t *testing.T) {
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	srv.RateLimit = time.Hour
	a, _ := newTelemeterPair(t, srv, nil)
	s := NewTelemeterSender(srv.URL+"/upload", srv.Client(), a, TelemeterSenderOptions{RateLimit: time.Hour})
	now := time.Now().UnixMilli()
	require.NoError(t, s.Send(context.Background(), telemeterBatch(now)))
	var re RetryableError
	require.ErrorAs(t, s.Send(context.Background(), telemeterBatch(now)), &re)
	require.InDelta(t, time.Hour.Seconds(), re.RetryAfter.Seconds(), 60)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Send(ctx, telemeterBatch(now))
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, errors.As(err, &re))
	require.Equal(t, 2, srv.Uploads(), "nothing sent while waiting")
}

func TestUploadPacerAnswers(t *testing.T) {
	now := time.Unix(1000, 0)
	limited := func(retryAfter time.Duration) error {
		return RetryableError{Err: &HTTPError{Code: http.StatusTooManyRequests}, RetryAfter: retryAfter}
	}
	for _, tc := range []struct {
		name    string
		err     error
		limited bool // the pacer waits from now on
	}{
		{"success", nil, false},
		{"400 counts, no limit shown", &HTTPError{Code: http.StatusBadRequest}, false},
		{"401 is before the limiter", &HTTPError{Code: http.StatusUnauthorized}, false},
		{"network error", RetryableError{Err: errors.New("refused")}, false},
		{"429 with Retry-After: another limit, honoured as it is", limited(5 * time.Second), false},
		{"429 without Retry-After: telemeter-server's limiter", limited(0), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &uploadPacer{window: time.Minute, now: func() time.Time { return now }}
			p.counted(now.Add(-10 * time.Second))
			err := p.answered(tc.err)
			require.Equal(t, tc.limited, p.remaining() > 0, "remaining %s", p.remaining())
			var re RetryableError
			if tc.limited {
				require.ErrorAs(t, err, &re)
				require.Equal(t, 50*time.Second, re.RetryAfter, "the rest of the window since the last counted upload")
				return
			}
			require.Equal(t, tc.err, err)
		})
	}
}

// The window the docs promise (docs/migrating-from-telemeter.md, "One
// upload per 4m30s"): telemeter-server's default --ratelimit, used when
// RateLimit is unset; negative turns pacing off.
func TestTelemeterSenderRateLimitDefault(t *testing.T) {
	require.Equal(t, 4*time.Minute+30*time.Second, NewTelemeterSender("", nil, nil, TelemeterSenderOptions{}).pacer.window)
	p := NewTelemeterSender("", nil, nil, TelemeterSenderOptions{RateLimit: -1}).pacer
	err := p.answered(RetryableError{Err: &HTTPError{Code: http.StatusTooManyRequests}})
	var re RetryableError
	require.ErrorAs(t, err, &re)
	require.Zero(t, re.RetryAfter, "no window to wait out")
	require.Zero(t, p.remaining())
}

// latency delays every request by d on its way to the server, as a network
// does between the sender's send and the server's limiter.
type latency struct {
	d    time.Duration
	next http.RoundTripper
}

func (l latency) RoundTrip(req *http.Request) (*http.Response, error) {
	select {
	case <-time.After(l.d):
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return l.next.RoundTrip(req)
}

// TestTelemeterSenderPacesFromTheAnswer: the server's limiter counts an
// upload when it arrives, after it was sent; the window is waited out from
// the answer, so the next upload does not arrive early by the latency and
// get refused.
func TestTelemeterSenderPacesFromTheAnswer(t *testing.T) {
	const window = time.Second
	srv := telemetertest.NewServer("fleet")
	defer srv.Close()
	srv.RateLimit = window
	a, _ := newTelemeterPair(t, srv, nil)
	slow := &http.Client{Transport: latency{d: 200 * time.Millisecond, next: srv.Client().Transport}}
	s := NewTelemeterSender(srv.URL+"/upload", slow, a, TelemeterSenderOptions{RateLimit: window})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	require.NoError(t, s.Send(ctx, telemeterBatch(now)))
	var re RetryableError
	require.ErrorAs(t, s.Send(ctx, telemeterBatch(now)), &re, "the limiter shows itself")
	for range 2 {
		require.NoError(t, s.Send(ctx, telemeterBatch(now)), "paced, never refused again")
	}
	require.Len(t, srv.Rejections(), 1, "%v", srv.Rejections())
}
