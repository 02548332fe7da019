package auth

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is an injectable clock, safe to read from lookups that run in
// the background; tests move it instead of sleeping.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fleetFunc is a FleetAuthorizer made of a function.
type fleetFunc func(ctx context.Context, token string, cluster ClusterIDs) (string, error)

func (f fleetFunc) AuthorizeFleet(ctx context.Context, token string, cluster ClusterIDs) (string, error) {
	return f(ctx, token, cluster)
}

// unhashed is a cluster id stored as sent, as without cluster_id_hash.
func unhashed(id string) ClusterIDs { return ClusterIDs{Sent: id, Stored: id} }
