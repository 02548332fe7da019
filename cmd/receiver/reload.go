package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// reloadHandler serves POST and PUT /-/reload as Prometheus does: it runs
// every reload SIGHUP triggers (the configuration file, the gathering
// definitions, the tokens and keys files, the rule files), and answers 200
// once they succeeded or 500 when one kept the running version. It goes
// behind auth.Middleware with the admin permission, which is one tenant's:
// the 500 does not say why, since the reasons name every tenant's
// definition files and problems; the log does (each reload logs its error).
func reloadHandler(reloads []func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if failed := reloadAll(reloads); failed > 0 {
			http.Error(w, fmt.Sprintf("failed to reload: %d of %d reloads kept the running version; the receiver's log says why (level=error)", failed, len(reloads)), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}

// reloadAll runs every reload, also after one failed, and returns how many
// failed (each logs and counts its own error).
func reloadAll(reloads []func() error) (failed int) {
	for _, reload := range reloads {
		if reload() != nil {
			failed++
		}
	}
	return failed
}

// reloadOnSIGHUP is the run group actor that runs every reload on each
// SIGHUP, as POST /-/reload does. It subscribes at once, so a SIGHUP sent
// once the receiver has logged that it listens is not lost.
func reloadOnSIGHUP(reloads []func() error) (execute func() error, interrupt func(error)) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(context.Background())
	return func() error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-hup:
					reloadAll(reloads)
				}
			}
		}, func(error) {
			signal.Stop(hup)
			cancel()
		}
}

// reloadingFile is a file re-read every interval by Run, and on demand by
// Reload (SIGHUP, POST /-/reload): auth.FileTokens, auth.FileKeys.
type reloadingFile interface {
	Reload() error
	Run(ctx context.Context, interval time.Duration) error
}
