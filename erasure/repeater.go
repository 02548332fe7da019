package erasure

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/phonehome/phonehome/peers"
	"github.com/phonehome/phonehome/storage"
)

// The retries of a call a peer missed (not configurable: docs/lifecycle.md).
const (
	// repeatRetryMin is the wait before the first retry, doubled before
	// each later one up to repeatRetryMax.
	repeatRetryMin = 5 * time.Second
	repeatRetryMax = time.Minute
	// repeatFor bounds how long a call a peer missed is retried, and so
	// how long the caller's credential is held (in memory only).
	repeatFor = time.Hour
)

// Repeater repeats the erasures and re-admissions taken here on the other
// replicas, and keeps retrying each on the peers that did not take it
// (down, restarting, timing out, answering 5xx or 429) in the background,
// until they do, refuse it for good (another 4xx), repeatFor
// passes, a newer call for the same cluster supersedes it, or Run stops.
// An erasure is a compliance promise: a replica that was down when it was
// posted must not keep the cluster's data and take its writes.
//
// A peer that leaves discovery while it misses a call is not retried, but
// the call stays pending until a peer that joined since has taken it in its
// place (a restarted pod comes back at a new address) or repeatFor passes. The
// caller's Authorization header is held in memory, never written, for as
// long as the call is pending.
//
// Its methods are safe for concurrent use. A nil *Repeater repeats nothing
// (a single receiver).
type Repeater struct {
	logger   *slog.Logger
	replicas Replicas
	m        repeatMetrics

	mu      sync.Mutex
	ctx     context.Context // Run's, while it runs
	stopped bool            // Run has returned or is returning
	pending map[*pendingCall]struct{}
	wg      sync.WaitGroup // the retry loops
}

// NewRepeater returns a Repeater over replicas; Run retries. reg may be nil.
func NewRepeater(logger *slog.Logger, reg prometheus.Registerer, replicas Replicas) *Repeater {
	return &Repeater{logger: logger, replicas: replicas, m: newRepeatMetrics(reg), pending: map[*pendingCall]struct{}{}}
}

// Run retries the pending calls until ctx ends, then waits for their
// retries to stop: the calls still pending are logged and forgotten.
func (rp *Repeater) Run(ctx context.Context) error {
	rp.mu.Lock()
	rp.ctx = ctx
	for c := range rp.pending {
		rp.startLocked(c)
	}
	rp.mu.Unlock()
	<-ctx.Done()
	rp.mu.Lock()
	rp.stopped = true
	rp.mu.Unlock()
	rp.wg.Wait()
	return nil
}

// repeat submits req, taken here, to the other replicas unless r was itself
// repeated by one, and returns their results and a warning for each replica
// that did not take it. The calls outlive a caller that goes away (each is
// bounded by peers.timeout): the job here is taken, and the other
// replicas' must be too.
//
// A pending retry of an older call for the same cluster is dropped first,
// so that the peers apply the two in order; also when another replica
// repeats the newer call here, as it repeats it on the peers this one
// retries.
func (rp *Repeater) repeat(r *http.Request, path string, req Request) ([]ReplicaResult, []string) {
	if rp == nil {
		return nil, nil
	}
	c := &pendingCall{
		path: path, authorization: r.Header.Get("Authorization"), tenant: req.Tenant,
		until: time.Now().Add(repeatFor), called: map[string]bool{}, settled: map[string]bool{}, left: map[string]bool{}, done: make(chan struct{}),
	}
	if req.ClusterID != "" {
		c.cluster, c.clusterSHA = req.ClusterID, storage.ClusterDigest(req.Tenant, req.ClusterID)
	}
	rp.supersede(c)
	if r.Header.Get(peers.OriginHeader) != "" {
		return nil, nil
	}
	body, err := json.Marshal(req)
	if err != nil { // a Request always marshals
		return nil, []string{"not repeated on the other replicas: " + err.Error()}
	}
	c.body = body
	if path == erasePath && req.ClusterID != "" { // also without deny: a re-admission must not drop it
		admitted := req
		admitted.Deny = new(false)
		c.admittedBody, _ = json.Marshal(admitted)
	}
	var (
		results  []ReplicaResult
		warnings []string
		missed   []ReplicaResult
	)
	for _, a := range rp.replicas.Broadcast(context.WithoutCancel(r.Context()), path, c.authorization, body) {
		res, out := replicaResult(a)
		if out == itself { // Broadcast drops those; not a replica
			continue
		}
		rp.m.repeats.WithLabelValues(string(out)).Inc()
		c.called[a.Peer] = true
		switch out {
		case refused:
			c.settled[a.Peer] = true
			warnings = append(warnings, fmt.Sprintf("replica %s refused it (%s): not retried; send it to that replica again once that is fixed", a.Peer, res.Error))
		case failed:
			missed = append(missed, res)
			c.waiting = append(c.waiting, a.Peer)
		default:
			c.settled[a.Peer] = true
		}
		results = append(results, res)
	}
	if len(missed) == 0 {
		return results, warnings
	}
	retried := rp.add(c)
	for _, res := range missed {
		switch {
		case !retried:
			warnings = append(warnings, fmt.Sprintf("replica %s did not take it (%s), and this replica is stopping: send it to that replica again", res.Replica, res.Error))
		case path == erasePath:
			warnings = append(warnings, fmt.Sprintf("replica %s did not take it (%s): this replica retries it there for up to %s; its job appears in GET /api/v1/admin/erase on that replica", res.Replica, res.Error, repeatFor))
		default:
			warnings = append(warnings, fmt.Sprintf("replica %s did not take it (%s): this replica retries it there for up to %s, and logs %q when it does", res.Replica, res.Error, repeatFor, msgRepeatDelivered))
		}
	}
	return results, warnings
}

// supersede drops the pending calls for c's cluster and waits until none
// of their retries is in flight. A re-admission keeps a pending erasure
// (admittedBody): it is sent without its deny from then on.
func (rp *Repeater) supersede(c *pendingCall) {
	if c.cluster == "" {
		return
	}
	var older, admitted []*pendingCall
	rp.mu.Lock()
	for o := range rp.pending {
		if o.tenant == c.tenant && o.cluster == c.cluster {
			if c.path == readmitPath && o.admittedBody != nil {
				o.admitted = true
				admitted = append(admitted, o)
				continue
			}
			older = append(older, o)
			delete(rp.pending, o)
			o.superseded = true
			if o.cancel != nil {
				o.cancel()
			} else { // not started: Run was not running yet
				rp.endLocked(o, "superseded")
			}
		}
	}
	rp.m.pending.Set(float64(len(rp.pending)))
	rp.mu.Unlock()
	for _, o := range admitted { // an attempt in flight may still deny
		o.attempting.Lock()
		o.attempting.Unlock() //nolint:staticcheck // a wait, not a critical section
	}
	for _, o := range older {
		<-o.done
	}
}

// add makes c pending, and false if Run has stopped.
func (rp *Repeater) add(c *pendingCall) bool {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.stopped {
		return false
	}
	rp.pending[c] = struct{}{}
	rp.m.pending.Set(float64(len(rp.pending)))
	if rp.ctx != nil {
		rp.startLocked(c)
	}
	return true
}

// startLocked starts c's retries. rp.mu must be held, and Run running.
func (rp *Repeater) startLocked(c *pendingCall) {
	ctx, cancel := context.WithCancel(rp.ctx)
	c.cancel = cancel
	rp.wg.Go(func() {
		defer cancel()
		why := rp.retry(ctx, c)
		rp.mu.Lock()
		delete(rp.pending, c)
		rp.m.pending.Set(float64(len(rp.pending)))
		rp.endLocked(c, why)
		rp.mu.Unlock()
	})
}

// endLocked logs and counts how c ended, drops its credential and
// releases supersede. rp.mu must be held.
func (rp *Repeater) endLocked(c *pendingCall, why string) {
	missing := c.missing()
	log := rp.logger.With("path", c.path, "tenant", c.tenant, "cluster_sha256", c.clusterSHA, "replicas", missing, "attempts", c.attempts)
	switch {
	case c.superseded:
		rp.m.repeats.WithLabelValues("superseded").Add(float64(len(missing)))
		log.Info("admin call repeat superseded by a newer call for the cluster")
	case why == "expired":
		rp.m.repeats.WithLabelValues("expired").Add(float64(len(missing)))
		log.Warn("admin call repeat given up: replicas did not take it in time; send it to them", "for", repeatFor.String())
	case why == "stopped":
		log.Warn("admin call repeat stopped with the receiver; send it to the replicas that did not take it")
	}
	c.authorization = ""
	close(c.done)
}

type repeatMetrics struct {
	pending prometheus.Gauge
	repeats *prometheus.CounterVec
}

func newRepeatMetrics(reg prometheus.Registerer) repeatMetrics {
	f := promauto.With(reg)
	m := repeatMetrics{
		pending: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_erasure_repeats_pending",
			Help: "Erasures and re-admissions taken here that a peer has not taken yet: retried in the background for a bounded time.",
		}),
		repeats: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_erasure_repeats_total",
			Help: "Erasures and re-admissions repeated on a peer, by result: delivered; refused (a 4xx, not retried); failed (retried); and, per peer still missing it, superseded (by a newer call for the cluster) or expired (given up).",
		}, []string{"result"}),
	}
	for _, r := range []outcome{delivered, refused, failed, "superseded", "expired"} {
		m.repeats.WithLabelValues(string(r))
	}
	return m
}
