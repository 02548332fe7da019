package limits

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The table against a Go map under random inserts, updates and expiries.
// Small tables with many rounds put runs across the table's end (the
// wrap-around cases of find and of the backward shift); large ones grow and
// shrink through many sizes.
func TestSeriesTableMatchesMap(t *testing.T) {
	for _, tc := range []struct{ keys, rounds int }{{20, 3000}, {50, 1000}, {3000, 30}} {
		keys := tc.keys
		rng := rand.New(rand.NewPCG(1, uint64(keys)))
		var tab seriesTable
		model := map[Key]entry{}
		randKey := func() Key { return Key{0, uint64(rng.IntN(keys))} }
		for round := range tc.rounds {
			for range keys {
				k := randKey()
				// Some series look older than they are, so every expiry
				// removes a few from the middle of runs.
				seen := uint32(max(0, round-rng.IntN(4)))
				e := entry{seen: seen, cluster: rng.Uint32(), metric: rng.Uint32(), hint: rng.Uint64()}
				_, inModel := model[k]
				if i, ok := tab.find(k); ok != inModel {
					t.Fatalf("find(%v) = %v, want %v", k, ok, inModel)
				} else if ok {
					tab.slots[i].setEntry(e)
				} else {
					tab.insert(k, e)
				}
				model[k] = e
			}
			cutoff := uint32(round) - min(uint32(round), uint32(rng.IntN(3)))
			removed := tab.deleteWhere(func(e entry) bool { return e.seen < cutoff })
			var want int
			for k, e := range model {
				if e.seen < cutoff {
					delete(model, k)
					want++
				}
			}
			require.Equal(t, want, removed)
			require.Equal(t, len(model), tab.len())
			for k, e := range model {
				i, ok := tab.find(k)
				if !ok || tab.slots[i].entry() != e || tab.slots[i].key() != k {
					t.Fatalf("key %v: found %v, slot %+v, want entry %+v", k, ok, tab.slots[i], e)
				}
			}
			require.LessOrEqual(t, tab.len()*maxLoadDiv, len(tab.slots)*maxLoadNum, "over the maximum load")
		}
		// Everything expires: the table shrinks to its minimum.
		require.Equal(t, len(model), tab.deleteWhere(func(entry) bool { return true }))
		require.Equal(t, 0, tab.len())
		require.Len(t, tab.slots, tableMinSlots)
		_, ok := tab.find(Key{0, 1})
		require.False(t, ok)
	}
}

// Every field survives the 32-bit packing, including the extremes.
func TestSlotRoundTrip(t *testing.T) {
	for _, k := range []Key{{}, {1<<64 - 1, 1<<64 - 1}, {0x0123456789abcdef, 0xfedcba9876543210}} {
		for _, e := range []entry{{}, {seen: 1<<32 - 2, cluster: 1<<32 - 1, metric: 7, hint: 1<<64 - 1}} {
			var s slot
			s.set(k, e)
			require.False(t, s.free())
			require.Equal(t, k, s.key())
			require.Equal(t, e, s.entry())
		}
	}
}
