package main

import (
	"fmt"
	"net/http"
)

// reloadHandler serves POST and PUT /-/reload as Prometheus does: it runs
// every reload SIGHUP triggers (the configuration file, the gathering
// definitions), and answers 200 once they succeeded or 500 when one kept
// the running version. It goes behind auth.Middleware with the admin
// permission, which is one tenant's: the 500 does not say why, since the
// reasons name every tenant's definition files and problems; the log
// does (each reload logs its error).
func reloadHandler(reloads []func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		failed := 0
		for _, reload := range reloads { // every one, also after one failed
			if reload() != nil {
				failed++
			}
		}
		if failed > 0 {
			http.Error(w, fmt.Sprintf("failed to reload: %d of %d reloads kept the running version; the receiver's log says why (level=error)", failed, len(reloads)), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}
