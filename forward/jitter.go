package forward

import (
	"math/rand/v2"
	"time"
)

// Jitter settings shared by the forwarder's periodic and retry loops. Every
// forwarder of a fleet may start in the same second (after an outage or a
// rollout); random waits keep them from collecting, renewing and retrying in
// lockstep against one receiver.
const (
	// DefaultJitter is the fraction by which waits are randomized when an
	// Options' Jitter is 0 (unset).
	DefaultJitter = 0.1
	// NoJitter, as an Options' Jitter, turns randomization off: waits are
	// exactly the interval or backoff, and the first collection starts at
	// once. It is for tests and benchmarks; a fleet should never run so.
	NoJitter = -1.0
)

// JitterOption converts a configuration file's jitter, in which 0 is an
// explicit "off" (the file's defaults are applied before it is decoded, so
// an absent key keeps DefaultJitter), to an Options' Jitter, in which 0 means
// "unset, use the default" and NoJitter means off.
func JitterOption(fraction float64) float64 {
	if fraction == 0 {
		return NoJitter
	}
	return fraction
}

// spread returns d×(1±j), uniformly distributed.
func spread(d time.Duration, j float64) time.Duration {
	return time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
}

// upTo returns a uniformly distributed duration in [0, j×d).
func upTo(d time.Duration, j float64) time.Duration {
	return time.Duration(rand.Float64() * j * float64(d))
}

// stretch returns a uniformly distributed duration in [d, d×(1+j)): for a
// wait a server asked for (Retry-After), which must never be shortened but
// must not end at the same instant for every forwarder that was told it.
func stretch(d time.Duration, j float64) time.Duration {
	return d + upTo(d, j)
}

// cappedExp is minD<<attempt, capped at maxD, for any attempt ≥ 0 and
// 0 ≤ minD ≤ maxD: the shift is taken only where it stays at or below maxD
// (minD<<29 overflows for a minimum above ~17s).
func cappedExp(attempt int, minD, maxD time.Duration) time.Duration {
	if attempt >= 63 || minD > maxD>>attempt {
		return maxD
	}
	return minD << attempt
}
