package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/phonehome/phonehome/configdiff"
	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/relabel"
)

// errPseudonymChanged refuses a reload that would give the cluster another
// _id: the fleet would see a new cluster, and the queued data the old one.
var errPseudonymChanged = errors.New("the cluster pseudonym would change (--id or the anonymization salt changed): keeping the running configuration, restart to apply it")

// liveSections are the --config.file sections a reload applies; every other
// section (and any added later) is read only at start.
var liveSections = map[string]bool{"matches": true, "anonymize_labels": true, "relabel_configs": true}

// reloader re-runs load with the command line the process started with, on
// SIGHUP or POST /-/reload, and puts the policy of a valid new configuration
// in force: the selectors (--match-file, matches) and the relabeling
// (relabel_configs, anonymize labels, renames, external labels). The files
// the HTTP clients and the listener use (CA bundles, client certificates,
// token files, --web.config.file) need no reload: they are re-read when they
// change. Everything else is read only at start: a change to it is logged and flagged by
// phonehome_forward_config_restart_required, and applies at the next
// start. An invalid configuration, or one that changes the cluster
// pseudonym, is logged and counted, and the running policy stays.
//
// Reload is safe for concurrent use; reloads are serialized.
type reloader struct {
	logger  *slog.Logger
	flags   *flags
	started *setup             // as loaded at start
	fwd     *forward.Forwarder // nil while telemetry is disabled
	// poller, when set (--gathering-url), owns what is in force: a
	// definition from the fleet, or the local selectors as its fallback.
	// Set before the run group starts.
	poller *gathering.Poller
	// relabel holds the local relabel rules in force, which a gathering
	// definition adds its anonymize_labels to (applyDefinition).
	relabel atomic.Pointer[relabel.Config]

	mu sync.Mutex // serializes reloads
	m  reloadMetrics
}

type reloadMetrics struct {
	reloads         *prometheus.CounterVec
	lastSuccessful  prometheus.Gauge
	lastSuccess     prometheus.Gauge
	restartRequired prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) reloadMetrics {
	f := promauto.With(reg)
	m := reloadMetrics{
		reloads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_forward_config_reloads_total",
			Help: "Configuration reloads (SIGHUP, POST /-/reload) by result (success, failure).",
		}, []string{"result"}),
		lastSuccessful: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_config_last_reload_successful",
			Help: "Whether the last configuration reload attempt was successful (1) or kept the running configuration (0).",
		}),
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_config_last_reload_success_timestamp_seconds",
			Help: "Timestamp of the last successful configuration reload (or of the start).",
		}),
		restartRequired: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_forward_config_restart_required",
			Help: "1 when the configuration read by the last reload differed from the running one in what a reload does not apply (the cluster pseudonym, federate, send, queue, authorize and gathering settings): a restart is needed for it. Edits not yet reloaded are not seen.",
		}),
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	m.lastSuccessful.Set(1)
	m.lastSuccess.SetToCurrentTime()
	return m
}

// newReloader returns a reloader for the process started with f and s. fwd
// is nil while telemetry is disabled. reg may be nil.
func newReloader(logger *slog.Logger, reg prometheus.Registerer, f *flags, s *setup, fwd *forward.Forwarder) *reloader {
	r := &reloader{logger: logger, flags: f, started: s, fwd: fwd, m: newReloadMetrics(reg)}
	r.relabel.Store(&s.relabel)
	return r
}

// applyDefinition is the gathering poller's Apply: the definition's policy
// over the local relabel rules in force.
func (r *reloader) applyDefinition(c *gathering.Compiled) error {
	p, err := forward.DefinitionPolicy(*r.relabel.Load(), c)
	if err != nil {
		return err
	}
	return r.fwd.SetPolicy(p)
}

// Reload loads the configuration again and applies its policy, or returns
// why it kept the running one.
func (r *reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The gauges before the counter: whoever sees the count sees them.
	if err := r.reload(); err != nil {
		r.m.lastSuccessful.Set(0)
		r.m.reloads.WithLabelValues("failure").Inc()
		r.logger.Error("reload configuration, keeping the running one", "file", r.flags.configFile, "err", err)
		return err
	}
	r.m.lastSuccessful.Set(1)
	r.m.lastSuccess.SetToCurrentTime()
	r.m.reloads.WithLabelValues("success").Inc()
	return nil
}

func (r *reloader) reload() error {
	next, err := load(r.flags, r.logger)
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	next.defaultCacheFile(r.flags.queueDir)
	pending := r.restartOnly(next)
	if next.policy.Rules.HashedID() != r.started.policy.Rules.HashedID() {
		r.m.restartRequired.Set(1)
		return errPseudonymChanged
	}
	if err := r.applyPolicy(next); err != nil {
		return fmt.Errorf("apply policy: %w", err)
	}
	if len(pending) > 0 {
		r.m.restartRequired.Set(1)
		r.logger.Warn("configuration reloaded: selectors and relabeling applied; these changed and need a restart", "file", r.flags.configFile, "restart_required", pending)
		return nil
	}
	r.m.restartRequired.Set(0)
	r.logger.Info("configuration reloaded", "file", r.flags.configFile, "selectors", next.policy.Allow.Len())
	return nil
}

// applyPolicy puts next's selectors and relabel rules in force. With
// --gathering-url, the definition in force keeps deciding the selectors and
// is applied again over the new rules; while none is, the local selectors
// are its fallback.
func (r *reloader) applyPolicy(next *setup) error {
	if r.fwd == nil { // disabled: nothing runs
		r.relabel.Store(&next.relabel)
		return nil
	}
	local := next.policy
	if r.poller == nil {
		if err := r.fwd.SetPolicy(local); err != nil {
			return err
		}
		r.relabel.Store(&next.relabel)
		return nil
	}
	local.DefinitionVersion = "local"
	// Under the poller's lock: a poll cannot apply a definition over the
	// old rules in between.
	return r.poller.Reapply(func(c *gathering.Compiled) error {
		p, err := forward.DefinitionPolicy(next.relabel, c)
		if err != nil {
			return err
		}
		if err := r.fwd.SetPolicy(p); err != nil {
			return err
		}
		r.relabel.Store(&next.relabel)
		return nil
	}, func() (bool, error) {
		r.relabel.Store(&next.relabel)
		if local.Allow.Len() == 0 {
			// The selectors in force stay, under the new rules: a
			// reload applies its relabelling (an added anonymized
			// label) whole or not at all.
			r.logger.Warn("no local selectors in the reloaded configuration: keeping the ones in force until a gathering definition arrives")
			cur, ok := r.fwd.Policy()
			if !ok { // collecting nothing: nothing to relabel
				return false, nil
			}
			cur.Rules = next.policy.Rules
			return false, r.fwd.SetPolicy(cur)
		}
		return true, r.fwd.SetPolicy(local)
	})
}

// restartOnly names the --config.file sections, by YAML key, that next
// changes and only a restart applies. Flags cannot change, so the derived
// values compared are the file's.
func (r *reloader) restartOnly(next *setup) []string {
	return configdiff.Sections(r.started.file, next.file, liveSections)
}

// run reloads whenever hup delivers, until ctx is done.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			_ = r.Reload() // logged and counted
		}
	}
}

// handler serves POST and PUT /-/reload: 200 once reloaded, 500 with the
// reason the running configuration was kept, 403 when not enabled
// (--web.enable-lifecycle=false). It is on by default, as in
// telemeter-client: a reload only re-reads the files the process was started
// with, and cannot change the cluster's pseudonym.
func (r *reloader) handler(enabled bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !enabled {
			http.Error(w, "Lifecycle API is not enabled.", http.StatusForbidden)
			return
		}
		if err := r.Reload(); err != nil {
			http.Error(w, fmt.Sprintf("failed to reload config: %s", err), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}
