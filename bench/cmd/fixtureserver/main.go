// Command fixtureserver serves a Prometheus text exposition file (by default
// the synthetic federate sample of one cluster) on /metrics, so a real
// Prometheus can scrape it and a forwarder can federate it. Used by
// `make demo` and handy for trying a forwarder by hand.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("fixtureserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", "bench/testdata/federate-sample.prom", "Text exposition file to serve.")
	addr := fs.String("listen", "127.0.0.1:9099", "Address to serve /metrics on.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	body, err := os.ReadFile(*file)
	if err != nil {
		fmt.Fprintf(stderr, "fixtureserver: %v\n", err)
		return 2
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil))
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		logger.Error("listen", "addr", *addr, "err", err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(body)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		_ = srv.Close()
	}()
	logger.Info("listening", "addr", ln.Addr().String(), "file", *file)
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		logger.Error("serve", "err", err)
		return 1
	}
	return 0
}
