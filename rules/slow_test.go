package rules

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/internal/logbuf"
)

// slowPeerReader is fleetReader with a peer that, while slow, answers each
// read only after delay and then fails: a replica that answers /-/ready
// (so it is not skipped) but no read before peers.timeout. Every rule of
// a group then waits for it, one after the other.
type slowPeerReader struct {
	local, peer *tsdb.DB
	delay       time.Duration
	slow        atomic.Bool
}

func (r *slowPeerReader) Querier(_ string, mint, maxt int64) (promstorage.Querier, error) {
	lq, err := r.local.Querier(mint, maxt)
	if err != nil {
		return nil, err
	}
	var pq promstorage.Querier = slowPeer{delay: r.delay}
	if !r.slow.Load() {
		if pq, err = r.peer.Querier(mint, maxt); err != nil {
			return nil, err
		}
	}
	return promstorage.NewMergeQuerier([]promstorage.Querier{lq}, []promstorage.Querier{pq}, promstorage.ChainedSeriesMerge), nil
}

type slowPeer struct {
	deadPeer
	delay time.Duration
}

var errSlowPeer = fmt.Errorf("peer 10.0.3.7:9291 unavailable, its data is missing: %w", errors.New("remote_read: context deadline exceeded"))

func (p slowPeer) Select(ctx context.Context, _ bool, _ *promstorage.SelectHints, _ ...*labels.Matcher) promstorage.SeriesSet {
	// The peer's slowness itself, not a wait for the test's sake.
	t := time.NewTimer(p.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return promstorage.ErrSeriesSet(errSlowPeer)
}

// TestSlowPeerKeepsFiringAlertActive: with a slow peer every rule of a
// group waits for it before skipping, so an iteration lasts longer than an
// alert's validity (here 4 × the 200ms resend delay). A skipped rule's
// firing alert is sent at the end of the iteration: valid for four resend
// delays from the iteration's scheduled time, it reached Alertmanager
// already expired, which resolved it until the next send.
func TestSlowPeerKeepsFiringAlertActive(t *testing.T) {
	sink := &alertSink{}
	am := httptest.NewServer(sink)
	t.Cleanup(am.Close)
	reader := &slowPeerReader{local: clusterDB(t, "a"), peer: clusterDB(t, "b"), delay: 400 * time.Millisecond}
	m, _, stop := startFleetRules(t, `groups:
- name: fleet
  rules:
  - alert: FleetComplete
    expr: count(up) >= 2
  - record: clusters:count
    expr: count(up)
  - record: clusters:a
    expr: count(up{_id="a"})
  - record: clusters:b
    expr: count(up{_id="b"})
`, reader, &logbuf.Buffer{}, am.URL)
	resent := resentWhileSkipping(t, m, sink, func() { reader.slow.Store(true) })
	stop()

	for i, a := range resent {
		require.True(t, a.EndsAt.After(a.received), "send %d expired on arrival: valid until %v, received %v", i, a.EndsAt, a.received)
		if i+1 < len(resent) {
			next := resent[i+1].received
			require.True(t, a.EndsAt.After(next), "send %d expired at %v, before the next one arrived at %v: Alertmanager resolved it meanwhile", i, a.EndsAt, next)
		}
	}
}
