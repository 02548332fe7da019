package storage

import (
	"math"
	"time"
)

// PeerHorizon returns a time before which everything this receiver holds of
// tenant — and everything it can still accept — is already in the bucket:
// the minimum of the head's in-order and out-of-order min times, the min time
// of every local block not yet uploaded, and the oldest timestamp a write
// could still add (the head's appendable bound and its out-of-order window
// behind the head's max time). A tenant without data (or a closed DB) can
// still receive samples of any age, so its horizon is math.MinInt64.
//
// Peers read it to skip this receiver for queries that end before it: the
// bucket then holds all of this receiver's data for that range. It only ever
// moves forward while the receiver runs.
func (db *DB) PeerHorizon(tenant string) int64 {
	t, release, err := db.readTenant(tenant)
	if err != nil {
		return math.MinInt64
	}
	defer release() // also for an unknown tenant: readTenant holds the DB open either way
	if t == nil {
		return math.MinInt64
	}
	h := t.db.Head()
	appendable, ok := h.AppendableMinValidTime()
	if !ok || h.NumSeries() == 0 || h.MaxTime() == math.MinInt64 {
		return math.MinInt64
	}
	horizon := min(h.MinTime(), appendable, h.MaxTime()-time.Duration(db.cfg.OutOfOrderWindow).Milliseconds())
	if ooo := h.MinOOOTime(); ooo != math.MaxInt64 {
		horizon = min(horizon, ooo)
	}
	for _, b := range t.db.Blocks() {
		if m := b.Meta(); !t.isUploaded(m.ULID) {
			horizon = min(horizon, m.MinTime)
		}
	}
	return horizon
}
