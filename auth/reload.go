package auth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// FileTokens is a tokens file that is re-read while the receiver runs, so a
// revoked token stops working without a restart. An invalid new version is
// logged and counted, and the previous tokens stay in force.
type FileTokens struct {
	path    string
	logger  *slog.Logger
	cur     atomic.Pointer[Tokens]
	sum     [sha256.Size]byte // of the file content in force
	reloads *prometheus.CounterVec

	// OnChange, if set before Run, is called after Run's reload put a
	// changed file in force (the receiver warns about its tokens again).
	OnChange func()
}

// NewFileTokens loads path; it fails if the first load fails. reg may be nil.
func NewFileTokens(logger *slog.Logger, reg prometheus.Registerer, path string) (*FileTokens, error) {
	f := &FileTokens{
		path: path, logger: logger,
		reloads: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_auth_tokens_reloads_total",
			Help: "Reloads of the tokens file by result (success, failure).",
		}, []string{"result"}),
	}
	f.reloads.WithLabelValues("success")
	f.reloads.WithLabelValues("failure")
	if err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Reload re-reads the file if its content changed.
func (f *FileTokens) Reload() error {
	b, err := os.ReadFile(f.path)
	if err != nil {
		f.reloads.WithLabelValues("failure").Inc()
		return fmt.Errorf("read tokens file: %w", err)
	}
	if f.cur.Load() != nil && sha256.Sum256(b) == f.sum {
		return nil
	}
	t, err := parseTokensFile(f.path, b) // the bytes hashed below: one read
	if err != nil {
		f.reloads.WithLabelValues("failure").Inc()
		return err
	}
	f.cur.Store(t)
	f.sum = sha256.Sum256(b)
	f.reloads.WithLabelValues("success").Inc()
	return nil
}

// Run reloads every interval until ctx is done.
func (f *FileTokens) Run(ctx context.Context, interval time.Duration) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			before := f.cur.Load()
			if err := f.Reload(); err != nil {
				f.logger.Error("reload tokens file, keeping the previous tokens", "file", f.path, "err", err)
			} else if f.cur.Load() != before && f.OnChange != nil {
				f.OnChange()
			}
		}
	}
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
