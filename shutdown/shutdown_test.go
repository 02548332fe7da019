//go:build unix

package shutdown

import (
	"errors"
	"syscall"
	"testing"
	"time"

	oklogrun "github.com/oklog/run"
	"github.com/stretchr/testify/require"
)

// A signal that arrives before the group runs the actor still ends it, and
// a second one does not kill the process.
func TestSignalBeforeTheGroupRunsIsKept(t *testing.T) {
	execute, interrupt := Signals()
	require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGTERM))
	require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGTERM)) // this process lives on

	var g oklogrun.Group
	g.Add(execute, interrupt)
	stop := make(chan struct{})
	g.Add(func() error { <-stop; return nil }, func(error) { close(stop) })
	done := make(chan error, 1)
	go func() { done <- g.Run() }()
	select {
	case err := <-done:
		require.True(t, errors.Is(err, oklogrun.ErrSignal), "%v", err)
		var se *oklogrun.SignalError
		require.ErrorAs(t, err, &se)
		require.Equal(t, syscall.SIGTERM, se.Signal)
	case <-time.After(10 * time.Second):
		t.Fatal("the signal sent before the group ran was lost")
	}
}

func TestInterruptEndsTheActor(t *testing.T) {
	execute, interrupt := Signals()
	done := make(chan error, 1)
	go func() { done <- execute() }()
	interrupt(nil)
	require.NoError(t, <-done)
}
