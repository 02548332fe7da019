package webtls

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"
)

// CAFileTransport returns base as an http.RoundTripper that trusts the CAs
// in caFile, re-read when the file changes on disk: a rotated CA bundle
// (OpenShift's service CA, cert-manager's trust bundles) is trusted from the
// next connection on, without a restart or a reload. Connections already
// open keep the pool they were verified with; idle ones are closed at the
// change. A bundle that does not load (a write half done) keeps the last
// good pool until the file changes again; logger (nil: none) says so, and
// when a bundle is reloaded.
//
// The bundle is loaded now, so a bad one fails at start. base's TLS
// settings (client certificate, server name, minimum version) are kept;
// its RootCAs are replaced. With caFile empty, base is returned as it is
// (the system roots, or base's own RootCAs).
func CAFileTransport(base *http.Transport, caFile string, logger *slog.Logger) (http.RoundTripper, error) {
	if caFile == "" {
		return base, nil
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &rootsTransport{file: caFile, base: base, logger: logger}
	fi, err := os.Stat(caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	if err := r.load(stampOf(fi)); err != nil {
		return nil, err
	}
	return r, nil
}

// rootsTransport serves requests from a clone of base whose RootCAs are
// the bundle as last loaded.
type rootsTransport struct {
	file   string
	base   *http.Transport
	logger *slog.Logger

	mu    sync.Mutex
	stamp fileStamp // of the bundle cur trusts
	bad   fileStamp // of a version that did not load: not read again
	cur   *http.Transport
}

// fileStamp tells a changed file from an unchanged one without reading it:
// every request checks it.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(fi os.FileInfo) fileStamp { return fileStamp{fi.ModTime(), fi.Size()} }

func (r *rootsTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return r.current().RoundTrip(req)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport in use.
func (r *rootsTransport) CloseIdleConnections() {
	r.mu.Lock()
	cur := r.cur
	r.mu.Unlock()
	cur.CloseIdleConnections()
}

// current loads the bundle again if its file changed since, and returns the
// transport to use. A file that is gone (briefly, while it is replaced) or
// does not load keeps the one in use.
func (r *rootsTransport) current() *http.Transport {
	fi, err := os.Stat(r.file)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		return r.cur
	}
	st := stampOf(fi)
	if st == r.stamp || st == r.bad {
		return r.cur
	}
	old := r.cur
	if err := r.load(st); err != nil {
		r.bad = st
		r.logger.Warn("CA bundle changed but does not load: keeping the last good one until the file changes again", "file", r.file, "err", err)
		return r.cur
	}
	old.CloseIdleConnections()
	r.logger.Info("CA bundle reloaded", "file", r.file)
	return r.cur
}

// load reads the bundle, whose stat was st, into a new transport. st is
// taken before the read: a change during the read is seen by the next
// request. r.mu is held, or r not yet shared.
func (r *rootsTransport) load(st fileStamp) error {
	pool, err := LoadCAFile(r.file)
	if err != nil {
		return err
	}
	next := r.base.Clone()
	if next.TLSClientConfig == nil {
		next.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	next.TLSClientConfig.RootCAs = pool
	r.cur, r.stamp = next, st
	return nil
}
