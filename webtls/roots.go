package webtls

import (
	"crypto/tls"
	"fmt"
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
// good pool until the file changes again.
//
// The bundle is loaded now, so a bad one fails at start. base's TLS
// settings (client certificate, server name, minimum version) are kept;
// its RootCAs are replaced. With caFile empty, base is returned as it is
// (the system roots, or base's own RootCAs).
func CAFileTransport(base *http.Transport, caFile string) (http.RoundTripper, error) {
	if caFile == "" {
		return base, nil
	}
	r := &rootsTransport{file: caFile, base: base}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

// rootsTransport serves requests from a clone of base whose RootCAs are
// the bundle as last loaded.
type rootsTransport struct {
	file string
	base *http.Transport

	mu    sync.Mutex
	stamp fileStamp // of the bundle cur trusts
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
// transport to use. A file that cannot be read or parsed keeps the one in
// use: the next request tries again.
func (r *rootsTransport) current() *http.Transport {
	fi, err := os.Stat(r.file)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil || stampOf(fi) == r.stamp {
		return r.cur
	}
	old := r.cur
	if r.loadLocked() == nil && old != nil {
		old.CloseIdleConnections()
	}
	return r.cur
}

func (r *rootsTransport) load() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loadLocked()
}

// loadLocked reads the bundle into a new transport. The stamp is taken
// before the read: a change during the read is seen by the next request.
func (r *rootsTransport) loadLocked() error {
	fi, err := os.Stat(r.file)
	if err != nil {
		return fmt.Errorf("read CA file: %w", err)
	}
	pool, err := LoadCAFile(r.file)
	if err != nil {
		return err
	}
	next := r.base.Clone()
	if next.TLSClientConfig == nil {
		next.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	next.TLSClientConfig.RootCAs = pool
	r.cur, r.stamp = next, stampOf(fi)
	return nil
}
