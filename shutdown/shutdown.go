// Package shutdown ends a process' oklog/run group at SIGINT or SIGTERM.
//
// oklog/run's SignalHandler subscribes to the signals only once the group
// runs its actor, so a signal that arrives while the group starts (the
// server already listening, a supervisor already stopping it) is lost when
// another subscription keeps Go from its default action, or kills the
// process mid-start when none does. Signals subscribes at once instead, and
// for good.
package shutdown

import (
	"os"
	"os/signal"
	"syscall"

	oklogrun "github.com/oklog/run"
)

// Signals subscribes to SIGINT and SIGTERM now and returns an oklog/run
// actor that ends the group with an *oklogrun.SignalError at the first
// (errors.Is(err, oklogrun.ErrSignal)), whenever it arrived. Call it before
// anything the group runs can announce that the process is up. The
// subscription is never stopped: a second signal (Ctrl-C twice, a
// supervisor signalling the process group and then the process) must not
// kill a shutdown that is flushing, which Go's default action would.
func Signals() (execute func() error, interrupt func(error)) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	stop := make(chan struct{})
	return func() error {
			select {
			case s := <-c:
				return &oklogrun.SignalError{Signal: s}
			case <-stop:
				return nil
			}
		}, func(error) {
			close(stop)
		}
}
