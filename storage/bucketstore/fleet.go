package bucketstore

import (
	"slices"
	"time"
)

// SyncedSince reports whether a sync that started after t has succeeded,
// so every block uploaded before t is known. Peers use it to skip a replica
// whose data before a time is all in the bucket. A nil Store never has.
func (s *Store) SyncedSince(t time.Time) bool {
	if s == nil {
		return false
	}
	return s.syncedFrom.Load() > t.UnixNano()
}

// Listed reports whether the bucket has been listed once since the start
// (a Sync succeeded): before, the blocks only in the bucket are unknown. A
// nil Store has no bucket, so nothing is missing from it.
func (s *Store) Listed() bool {
	return s == nil || s.syncedFrom.Load() != 0
}

// Attempted reports whether a Sync has ended since the start, successful
// or not (the receiver is ready once it has, or after a grace period). A nil
// Store has nothing to sync.
func (s *Store) Attempted() bool {
	return s == nil || s.attempted.Load()
}

// Tenants returns the tenants of the blocks known from the last syncs,
// sorted. A nil Store knows none.
func (s *Store) Tenants() []string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, k := range s.blocks {
		if k.meta != nil {
			out = append(out, k.meta.Thanos.Labels[TenantLabel])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
