package limits

import "math/bits"

// seriesTable is one shard's set of tracked series: an open-addressing hash
// table with linear probing, kept between 64 % and 80 % full by growing 25 %
// at a time. A Go map would do, but it doubles when it grows (and its tables
// fill in step, as the keys are uniform), so a tracked series cost a 40-byte
// slot at 40–80 % load: 81–101 B. Here a slot is 36 bytes at 64–80 %, 45–56
// B per series (issue 19: memory per active series).
//
// Not safe for concurrent use: the shard's mutex guards it.
type seriesTable struct {
	slots []slot
	n     int // occupied slots
}

// slot holds a Key and its entry in 32-bit words only, so that alignment
// does not pad it from 36 to 40 bytes.
type slot struct {
	k       [4]uint32
	hint    [2]uint32
	seen1   uint32 // entry.seen + 1; 0 marks a free slot
	cluster uint32
	metric  uint32
}

const (
	tableMinSlots = 8
	// Grow by 1/growDiv when more than maxLoadNum/maxLoadDiv of the slots
	// would be taken; shrink (Expire) below a quarter.
	maxLoadNum, maxLoadDiv = 4, 5
	growDiv                = 4
)

func (s *slot) free() bool { return s.seen1 == 0 }

func (s *slot) key() Key {
	return Key{uint64(s.k[0])<<32 | uint64(s.k[1]), uint64(s.k[2])<<32 | uint64(s.k[3])}
}

func (s *slot) entry() entry {
	return entry{seen: s.seen1 - 1, cluster: s.cluster, metric: s.metric, hint: uint64(s.hint[0])<<32 | uint64(s.hint[1])}
}

func (s *slot) set(k Key, e entry) {
	s.k = [4]uint32{uint32(k[0] >> 32), uint32(k[0]), uint32(k[1] >> 32), uint32(k[1])}
	s.setEntry(e)
}

func (s *slot) setEntry(e entry) {
	s.hint = [2]uint32{uint32(e.hint >> 32), uint32(e.hint)}
	s.seen1, s.cluster, s.metric = e.seen+1, e.cluster, e.metric
}

// home is where k's probe sequence starts. Both halves are hashes, but the
// seeded one's top bits already chose the shard, and tests use small ones:
// mix before scaling to the table's length (which is not a power of two).
func (t *seriesTable) home(k Key) int {
	hi, _ := bits.Mul64((k[0]^k[1])*0x9e3779b97f4a7c15, uint64(len(t.slots)))
	return int(hi)
}

func (t *seriesTable) len() int { return t.n }

// find returns the index of k's slot, or false.
func (t *seriesTable) find(k Key) (int, bool) {
	if t.n == 0 {
		return 0, false
	}
	want := [4]uint32{uint32(k[0] >> 32), uint32(k[0]), uint32(k[1] >> 32), uint32(k[1])}
	for i := t.home(k); ; {
		s := &t.slots[i]
		if s.free() {
			return 0, false
		}
		if s.k == want {
			return i, true
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// touch moves the last-seen time of series k forward to now and returns its
// entry, or false if k is not in the table.
func (t *seriesTable) touch(k Key, now uint32) (entry, bool) {
	i, ok := t.find(k)
	if !ok {
		return entry{}, false
	}
	s := &t.slots[i]
	e := s.entry()
	if e.seen < now {
		e.seen = now
		s.setEntry(e)
	}
	return e, true
}

// setHint stores hint with series k if it is in the table.
func (t *seriesTable) setHint(k Key, hint uint64) {
	if i, ok := t.find(k); ok {
		s := &t.slots[i]
		e := s.entry()
		e.hint = hint
		s.setEntry(e)
	}
}

// insert adds k, which must not be in the table.
func (t *seriesTable) insert(k Key, e entry) {
	if (t.n+1)*maxLoadDiv > len(t.slots)*maxLoadNum {
		t.resize(max(tableMinSlots, len(t.slots)+len(t.slots)/growDiv))
	}
	t.place(k, e)
	t.n++
}

func (t *seriesTable) place(k Key, e entry) {
	i := t.home(k)
	for !t.slots[i].free() {
		if i++; i == len(t.slots) {
			i = 0
		}
	}
	t.slots[i].set(k, e)
}

// resize rehashes into n slots, which must hold t.n at most maxLoad.
func (t *seriesTable) resize(n int) {
	old := t.slots
	t.slots = make([]slot, n)
	for i := range old {
		if s := &old[i]; !s.free() {
			t.place(s.key(), s.entry())
		}
	}
}

// deleteWhere removes every series for which drop returns true and returns
// how many it removed; then it shrinks a table that has emptied out.
func (t *seriesTable) deleteWhere(drop func(entry) bool) int {
	var removed int
	for i := 0; i < len(t.slots); {
		if s := &t.slots[i]; !s.free() && drop(s.entry()) {
			t.remove(i)
			removed++
			continue // another series may have moved into slot i
		}
		i++
	}
	// A series moved back across the end of the table (into a slot already
	// passed) is seen twice: harmless, as it was kept the first time.
	if len(t.slots) > tableMinSlots && t.n*4 < len(t.slots) {
		// As loaded as just after a growth.
		t.resize(max(tableMinSlots, t.n*maxLoadDiv*(growDiv+1)/(maxLoadNum*growDiv)+1))
	}
	return removed
}

// remove frees slot i by backward-shift deletion: each later series of the
// same run that may sit in the gap moves into it, so no tombstones are needed
// and find can stop at the first free slot.
func (t *seriesTable) remove(i int) {
	n := len(t.slots)
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		s := &t.slots[j]
		if s.free() {
			break
		}
		// s may move into the gap at i unless its home lies cyclically in
		// (i, j]: then i comes before the start of its probe sequence.
		h := t.home(s.key())
		if (i < j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			t.slots[i] = *s
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}
