package main

import (
	"errors"
	"fmt"
	"net/http"
)

// reloadHandler serves POST and PUT /-/reload as Prometheus does: it runs
// every reload SIGHUP triggers (the configuration file, the gathering
// definitions), and answers 200 once they succeeded or 500 with why the
// running versions were kept. It goes behind auth.Middleware with the
// admin permission.
func reloadHandler(reloads []func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		errs := make([]error, 0, len(reloads))
		for _, reload := range reloads {
			errs = append(errs, reload())
		}
		if err := errors.Join(errs...); err != nil {
			http.Error(w, fmt.Sprintf("failed to reload config: %s", err), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}
