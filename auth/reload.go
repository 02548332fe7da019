package auth

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/phonehome/phonehome/internal/periodic"
)

// reloadingFile keeps the last valid version of a file in force while the
// receiver runs: the tokens file (FileTokens) and the keys file (FileKeys).
// An invalid new version is logged and counted, and the previous version
// stays in force.
type reloadingFile[T any] struct {
	path    string
	what    string // "tokens", "keys": what the log says is kept
	logger  *slog.Logger
	load    func(path string) (*T, [sha256.Size]byte, error) // the version and a digest of every byte it read
	cur     atomic.Pointer[T]
	mu      sync.Mutex        // serializes reloads (Run, SIGHUP, POST /-/reload); guards sum
	sum     [sha256.Size]byte // of the version in force
	reloads *prometheus.CounterVec

	// OnChange, if set before Run or the first Reload, is called after a
	// reload put a changed file in force (the receiver warns about it again).
	OnChange func()
}

// newReloadingFile loads path; it fails if the first load fails.
func newReloadingFile[T any](logger *slog.Logger, reg prometheus.Registerer, path, what string, load func(string) (*T, [sha256.Size]byte, error)) (*reloadingFile[T], error) {
	f := &reloadingFile[T]{
		path: path, what: what, logger: logger, load: load,
		reloads: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_auth_" + what + "_reloads_total",
			Help: "Reloads of the " + what + " file by result (success, failure: the previous " + what + " stay in force).",
		}, []string{"result"}),
	}
	f.reloads.WithLabelValues("success")
	f.reloads.WithLabelValues("failure")
	if _, err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Reload re-reads the file and puts it in force if it changed. An invalid
// version is logged, counted and returned, and the previous one stays.
// OnChange runs if the version in force changed. Safe for concurrent use.
func (f *reloadingFile[T]) Reload() error {
	changed, err := f.reload()
	if err != nil {
		f.logger.Error("reload "+f.what+" file, keeping the previous "+f.what, "file", f.path, "err", err)
		return err
	}
	if changed && f.OnChange != nil {
		f.OnChange()
	}
	return nil
}

// reload is Reload without logging and OnChange.
func (f *reloadingFile[T]) reload() (changed bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, sum, err := f.load(f.path)
	if err != nil {
		f.reloads.WithLabelValues("failure").Inc()
		return false, err
	}
	if f.cur.Load() != nil && sum == f.sum {
		return false, nil
	}
	f.cur.Store(v)
	f.sum = sum
	f.reloads.WithLabelValues("success").Inc()
	return true, nil
}

// Run reloads every interval until ctx is done.
func (f *reloadingFile[T]) Run(ctx context.Context, interval time.Duration) error {
	periodic.Every(ctx, interval, func(context.Context) { _ = f.Reload() }) // logged and counted
	return nil
}

// FileTokens is a tokens file that is re-read while the receiver runs
// (Run, Reload), so a revoked token stops working without a restart.
type FileTokens struct {
	*reloadingFile[Tokens]
}

// NewFileTokens loads path; it fails if the first load fails. reg may be nil.
func NewFileTokens(logger *slog.Logger, reg prometheus.Registerer, path string) (*FileTokens, error) {
	f, err := newReloadingFile(logger, reg, path, "tokens", loadTokensFile)
	if err != nil {
		return nil, err
	}
	return &FileTokens{f}, nil
}

// Authenticate implements Authenticator.
func (f *FileTokens) Authenticate(r *http.Request) (Identity, error) {
	return f.cur.Load().Authenticate(r)
}

// AuthorizeFleet implements FleetAuthorizer.
func (f *FileTokens) AuthorizeFleet(ctx context.Context, token string, cluster ClusterIDs) (string, error) {
	return f.cur.Load().AuthorizeFleet(ctx, token, cluster)
}

// UnboundWriters is Tokens.UnboundWriters of the tokens in force.
func (f *FileTokens) UnboundWriters() []string { return f.cur.Load().UnboundWriters() }

// ExchangeOnly is Tokens.ExchangeOnly of the tokens in force.
func (f *FileTokens) ExchangeOnly() []string { return f.cur.Load().ExchangeOnly() }

// FileKeys is a signing keys file that is re-read while the receiver runs
// (Run, Reload), so a key is added or removed without a restart. A file
// without keys is invalid (LoadKeysFile), so a reload never leaves
// /authorize without a key.
type FileKeys struct {
	*reloadingFile[KeySet]
}

// NewFileKeys loads path; it fails if the first load fails. reg may be nil.
func NewFileKeys(logger *slog.Logger, reg prometheus.Registerer, path string) (*FileKeys, error) {
	f, err := newReloadingFile(logger, reg, path, "keys", loadKeysFile)
	if err != nil {
		return nil, err
	}
	return &FileKeys{f}, nil
}

// Current implements KeySource: the keys in force.
func (f *FileKeys) Current() *KeySet { return f.cur.Load() }
