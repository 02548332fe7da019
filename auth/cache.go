package auth

import (
	"crypto/sha256"
	"sync"
	"time"
)

// expiringCache maps digests of secrets (never the secrets) to values until
// they expire. It holds at most max entries: when full, the expired ones go
// first, then random ones (Go's map order) down to 7/8 of max, so a full
// cache costs one sweep per max/8 inserts. A max of 0 remembers nothing.
// The zero value is ready to use; safe for concurrent use.
type expiringCache[V any] struct {
	mu  sync.Mutex
	m   map[[sha256.Size]byte]expiringEntry[V]
	max int
}

type expiringEntry[V any] struct {
	v   V
	exp time.Time
}

// get returns the value of key and its expiry, unless it has expired at now.
func (c *expiringCache[V]) get(key [sha256.Size]byte, now time.Time) (V, time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if ok && !now.Before(e.exp) {
		delete(c.m, key)
		ok = false
	}
	if !ok {
		var zero V
		return zero, time.Time{}, false
	}
	return e.v, e.exp, true
}

// put remembers v for key until exp.
func (c *expiringCache[V]) put(key [sha256.Size]byte, v V, exp, now time.Time) {
	if c.max <= 0 || !now.Before(exp) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[[sha256.Size]byte]expiringEntry[V])
	}
	if _, ok := c.m[key]; !ok && len(c.m) >= c.max {
		c.evict(now)
	}
	c.m[key] = expiringEntry[V]{v: v, exp: exp}
}

// evict makes room; c.mu is held.
func (c *expiringCache[V]) evict(now time.Time) {
	for k, e := range c.m {
		if !now.Before(e.exp) {
			delete(c.m, k)
		}
	}
	for k := range c.m {
		if len(c.m) < c.max-c.max/8 {
			return
		}
		delete(c.m, k)
	}
}

// remove forgets key.
func (c *expiringCache[V]) remove(key [sha256.Size]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// len is the number of entries, expired ones not yet evicted included.
func (c *expiringCache[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
