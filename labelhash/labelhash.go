// Package labelhash hashes a series' labels as the remote-write decoder
// hands them over ([]prompb.Label), for in-memory lookups: the limiter's
// series tracker and the storage's head-reference cache. Each name and value
// is hashed where it lies (no copying into a hash buffer, which cost more
// than the hashing), and the results are chained so that order and
// boundaries count. Seeded hashes depend on a seed chosen per process, so
// they are never persisted or compared across processes.
package labelhash

import (
	"hash/maphash"
	"math/bits"

	"github.com/cespare/xxhash/v2"

	"github.com/prometheus/prometheus/prompb"
)

// Seeded hashes ls with seed (runtime hash). Without the seed nobody can
// construct two series that collide, so it suits keys a client may want to
// collide on purpose (the limiter's).
func Seeded(seed maphash.Seed, ls []prompb.Label) uint64 {
	h := uint64(len(ls))
	for _, l := range ls {
		h = chain(h, maphash.String(seed, l.Name))
		h = chain(h, maphash.String(seed, l.Value))
	}
	return h
}

// Unseeded hashes ls with xxhash, about 1.6× faster than Seeded but open to
// crafted collisions: use it only next to a Seeded hash.
func Unseeded(ls []prompb.Label) uint64 {
	h := uint64(len(ls))
	for _, l := range ls {
		h = chain(h, xxhash.Sum64String(l.Name))
		h = chain(h, xxhash.Sum64String(l.Value))
	}
	return h
}

// chain mixes x into h: a multiply-rotate round as in xxhash and wyhash.
func chain(h, x uint64) uint64 {
	return bits.RotateLeft64((h^x)*0x9e3779b97f4a7c15, 31) * 0xc2b2ae3d27d4eb4f
}
