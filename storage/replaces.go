package storage

import (
	"slices"

	"github.com/prometheus/prometheus/tsdb"
)

// Replaces reports whether block a stands for block b, as Thanos'
// deduplicate filter decides: b's compaction sources are all among a's,
// and a has more of them or, with the same sources, a is b's rewrite (b
// among a's parents) or, neither being the other's, a has the newer ULID.
//
// The parents come before the ULIDs: a ULID carries its writer's clock,
// and an erasure's rewrite made on a receiver whose clock is behind the
// one that wrote the block would otherwise lose to the block it replaces.
func Replaces(a, b tsdb.BlockMeta) bool {
	as, bs := a.Compaction.Sources, b.Compaction.Sources
	if len(bs) == 0 || len(as) < len(bs) {
		return false
	}
	for _, s := range bs {
		if !slices.Contains(as, s) {
			return false
		}
	}
	switch {
	case len(as) > len(bs):
		return true
	case hasParent(a, b):
		return true
	case hasParent(b, a):
		return false
	}
	return a.ULID.Compare(b.ULID) > 0
}

func hasParent(child, parent tsdb.BlockMeta) bool {
	return slices.ContainsFunc(child.Compaction.Parents, func(p tsdb.BlockDesc) bool { return p.ULID == parent.ULID })
}
