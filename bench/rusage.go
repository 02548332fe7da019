package bench

import (
	"syscall"
	"time"
)

// ProcessCPU is the user+system CPU time this process has used, for
// benchmarks that report CPU rather than wall time on a shared machine.
func ProcessCPU() time.Duration {
	ru := rusage()
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// MaxRSSMiB is this process's peak resident set size in MiB.
func MaxRSSMiB() float64 { return float64(rusage().Maxrss) / 1024 } // Linux reports KiB

func rusage() syscall.Rusage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic("getrusage: " + err.Error()) // only with a bad argument
	}
	return ru
}
