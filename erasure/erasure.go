// Package erasure erases one cluster's data (or the series matching a
// selector) of one tenant everywhere the receiver keeps it: the head, the
// WAL, the local blocks and every block in the bucket, and refuses the
// cluster's later writes until it is re-admitted. Jobs are persisted while
// they run, so a crash resumes them; every step is idempotent.
package erasure

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/phonehome/phonehome/atomicfile"
	"github.com/phonehome/phonehome/storage"
	"github.com/phonehome/phonehome/storage/lifecycle"
)

// Local is the receiver's storage as an erasure uses it (*storage.DB).
type Local interface {
	EraseLocal(ctx context.Context, tenant string, ms []*labels.Matcher, forbidden []string) (storage.LocalErasure, error)
	Deny(tenant, clusterID, comment string) error
	Readmit(tenant, clusterID string) (bool, error)
}

// Pushes erases from the installer pushes' aggregated state (*push.Gateway),
// which flushes into the head every few seconds and would write the series
// back after the local step.
type Pushes interface {
	Erase(tenant string, ms []*labels.Matcher) (int, error)
}

// Bucket erases from the bucket (*lifecycle.Runner).
type Bucket interface {
	EraseBucket(ctx context.Context, tenant string, ms []*labels.Matcher, forbidden []string, workDir string, progress func(done, total int)) (lifecycle.BucketErasure, error)
}

// Limiter forgets an erased cluster's series, status-page stats, rate
// bucket and name (*limits.Limiter), so that it takes no series budget and
// its id leaves the receiver's memory. It reports the series it forgot and
// whether it knew the cluster.
type Limiter interface {
	Forget(tenant, clusterID string) (series int, known bool)
}

// Request asks for an erasure: a tenant and either a cluster's _id or a
// series selector. With a cluster, its writes are refused afterwards unless
// Deny is false.
type Request struct {
	Tenant    string `json:"tenant"`
	ClusterID string `json:"cluster_id,omitempty"`
	Selector  string `json:"selector,omitempty"`
	Deny      *bool  `json:"deny,omitempty"`
	// RequestedBy is free text for the audit event (a ticket, a person).
	RequestedBy string `json:"requested_by,omitempty"`
	// Caller is who submitted it (set by the API: the credential's tenant
	// and the client address; "offline" for the command).
	Caller string `json:"-"`
}

// Job states.
const (
	StatePending = "pending"
	StateLocal   = "local"  // head, WAL, local blocks
	StateBucket  = "bucket" // bucket blocks
	StateDone    = "done"
	StateFailed  = "failed" // retried after a backoff, and at the next start
)

// Status is a job's progress, as the API shows it. It never holds the
// cluster's id, only its digest (storage.ClusterDigest).
type Status struct {
	ID            string `json:"id"`
	Tenant        string `json:"tenant"`
	ClusterSHA256 string `json:"cluster_sha256,omitempty"`
	// Selector is the request's, with _id values replaced by digests.
	Selector      string    `json:"selector,omitempty"`
	RequestedBy   string    `json:"requested_by,omitempty"`
	Caller        string    `json:"caller,omitempty"`
	State         string    `json:"state"`
	BlocksDone    int       `json:"blocks_done"`
	BlocksTotal   int       `json:"blocks_total"`
	SeriesRemoved int       `json:"series_removed"`
	Submitted     time.Time `json:"submitted"`
	Finished      time.Time `json:"finished,omitzero"`
	// LocalDone: the head, WAL and local blocks are erased. Until then the
	// tenant's blocks are not shipped (ShippingHeld), and a retry runs
	// every step; after it, only the bucket step.
	LocalDone bool `json:"local_done,omitempty"`
	// Failures counts the failed attempts; the next is at NextAttempt.
	Failures    int       `json:"failures,omitempty"`
	NextAttempt time.Time `json:"next_attempt,omitzero"`
	Error       string    `json:"error,omitempty"`
	// Warning is set on a done job that found nothing to erase on this
	// replica (see nothingFound).
	Warning string `json:"warning,omitempty"`
}

// job is a running or finished erasure. req holds the raw cluster id only
// while the job runs (and in its state file, deleted when it is done).
type job struct {
	req    Request
	status Status
	// pushed and local are what the local step removed, once it is done
	// (status.LocalDone): the audit event of a later attempt reports them.
	pushed int
	local  storage.LocalErasure
	// known: the limiter knew the cluster when the job forgot it there.
	known bool
}

// state is a job's file under the erasure directory.
type state struct {
	Request Request              `json:"request"`
	Status  Status               `json:"status"`
	Pushed  int                  `json:"pushed,omitempty"`
	Local   storage.LocalErasure `json:"local,omitzero"`
	Known   bool                 `json:"known,omitempty"`
}

// Eraser runs erasure jobs one at a time.
//
// Submit, Readmit, Get, List and ShippingHeld are safe for concurrent use;
// Run runs the jobs, retrying failed ones, until its context ends; Do runs
// one job in the caller's goroutine (the offline command) and must not be
// used while Run runs.
type Eraser struct {
	logger      *slog.Logger
	local       Local
	bucket      Bucket
	dir         string
	afterBucket func(context.Context) error
	pushes      Pushes
	limiter     Limiter // nil: none to forget in (the offline command)
	now         func() time.Time
	backoff     [2]time.Duration // first retry, longest wait
	m           *metrics

	mu    sync.Mutex
	jobs  map[string]*job
	queue chan string
	// admitMu orders a job's deny (Do) against a re-admission of its
	// cluster (Readmit): one taken while the job waits or runs must not
	// be undone by it.
	admitMu sync.Mutex
	// saveMu orders the writes of a job's state file and its removal: a
	// re-admission saves a job that Do runs and saves too, so the last
	// write must hold the latest state, and none may come after the
	// removal (it would put the raw cluster id back on disk).
	saveMu sync.Mutex
}

// Options are the optional parts of an Eraser.
type Options struct {
	// AfterBucket runs after a job's bucket step, e.g. the bucket store's
	// sync, which drops its cached copies of the deleted blocks.
	AfterBucket func(context.Context) error
	// Pushes, when set, is erased before the local storage.
	Pushes Pushes
	Now    func() time.Time
	// RetryMin and RetryMax bound the wait before a failed job runs
	// again: RetryMin, doubling per failure up to RetryMax (defaults 30s
	// and 10m).
	RetryMin, RetryMax time.Duration
}

// maxQueuedJobs bounds the jobs submitted and not yet run.
const maxQueuedJobs = 1024

// New returns an Eraser keeping job state in dir (created if needed) and
// queues the unfinished jobs found there. reg may be nil.
func New(logger *slog.Logger, reg prometheus.Registerer, local Local, bucket Bucket, dir string, opts Options) (*Eraser, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = 30 * time.Second
	}
	if opts.RetryMax < opts.RetryMin {
		opts.RetryMax = max(opts.RetryMin, 10*time.Minute)
	}
	e := &Eraser{
		logger: logger, local: local, bucket: bucket, dir: dir, afterBucket: opts.AfterBucket, pushes: opts.Pushes, now: opts.Now,
		backoff: [2]time.Duration{opts.RetryMin, opts.RetryMax},
		m:       newMetrics(reg), jobs: map[string]*job{},
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create erasure directory: %w", err)
	}
	// A job's state file half-written when the process died: it may hold
	// the cluster's id, and the job resumes from the complete one.
	if err := atomicfile.RemoveStaleIn(logger, dir, ".json"); err != nil {
		return nil, fmt.Errorf("remove torn erasure job state: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list erasure jobs: %w", err)
	}
	var resumed []string
	for _, de := range entries {
		if !strings.HasSuffix(de.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, de.Name()))
		if err != nil {
			return nil, fmt.Errorf("read erasure job: %w", err)
		}
		var st state
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("decode erasure job %s: %w", de.Name(), err)
		}
		st.Status.NextAttempt = time.Time{}
		e.jobs[st.Status.ID] = &job{req: st.Request, status: st.Status, pushed: st.Pushed, local: st.Local, known: st.Known}
		resumed = append(resumed, st.Status.ID)
		logger.Info("resuming erasure", "job", st.Status.ID, "tenant", st.Status.Tenant, "state", st.Status.State, "local_done", st.Status.LocalDone)
	}
	e.queue = make(chan string, len(resumed)+maxQueuedJobs) // every job found is queued, however many
	for _, id := range resumed {
		e.queue <- id
	}
	e.updateGauges()
	return e, nil
}

// SetLimiter makes each cluster erasure forget its cluster in l once the
// local storage is erased (and again when the job is done, for a write
// that was being admitted as the deny was taken). The receiver builds its
// limiter after the Eraser; call SetLimiter before Run.
func (e *Eraser) SetLimiter(l Limiter) { e.limiter = l }

// ShippingHeld reports whether tenant has an unfinished job that has not
// erased the local storage yet (Status.LocalDone): the receiver uploads
// none of the tenant's blocks meanwhile (storage.DB.HoldShipping), the
// shutdown's upload included. A job cut short after its head flush leaves
// local blocks that still hold the cluster (tombstoned, not yet rewritten);
// they must not reach the bucket, however often the job fails.
func (e *Eraser) ShippingHeld(tenant string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.holdsLocked(tenant)
}

func (e *Eraser) holdsLocked(tenant string) bool {
	for _, j := range e.jobs {
		if j.status.Tenant == tenant && j.status.State != StateDone && !j.status.LocalDone {
			return true
		}
	}
	return false
}

// ErrInvalid is a request that cannot be run.
var ErrInvalid = errors.New("invalid erasure request")

// ErrQueueFull refuses a job while maxQueuedJobs wait to run (503).
var ErrQueueFull = errors.New("too many erasure jobs queued, retry later")

// matchers returns the series to erase and the strings that must not be
// left anywhere (the cluster's id).
func (r Request) matchers() ([]*labels.Matcher, []string, error) {
	switch {
	case r.Tenant == "":
		return nil, nil, fmt.Errorf("%w: tenant is required", ErrInvalid)
	case (r.ClusterID == "") == (r.Selector == ""):
		return nil, nil, fmt.Errorf("%w: exactly one of cluster_id and selector is required", ErrInvalid)
	case r.ClusterID != "":
		return []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "_id", r.ClusterID)}, []string{r.ClusterID}, nil
	}
	ms, err := parser.NewParser(parser.Options{}).ParseMetricSelector(r.Selector)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: selector: %w", ErrInvalid, err)
	}
	if !slices.ContainsFunc(ms, func(m *labels.Matcher) bool { return !m.Matches("") }) {
		return nil, nil, fmt.Errorf("%w: selector %q matches every series", ErrInvalid, r.Selector)
	}
	var forbidden []string
	for _, m := range ms {
		if m.Type == labels.MatchEqual && m.Name == "_id" {
			forbidden = append(forbidden, m.Value)
		}
	}
	return ms, forbidden, nil
}

// redacted renders a selector with the value of every _id matcher replaced
// by its digest, for logs and the API.
func redacted(tenant string, ms []*labels.Matcher) string {
	parts := make([]string, 0, len(ms))
	for _, m := range ms {
		if m.Name == "_id" {
			m = &labels.Matcher{Type: m.Type, Name: m.Name, Value: "sha256:" + storage.ClusterDigest(tenant, m.Value)}
		}
		parts = append(parts, m.String())
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// Submit validates and persists a job, queues it and returns its status.
func (e *Eraser) Submit(req Request) (Status, error) {
	if _, _, err := req.matchers(); err != nil {
		return Status{}, err
	}
	if req.Deny == nil {
		deny := req.ClusterID != ""
		req.Deny = &deny
	}
	st := Status{
		ID: ulid.MustNew(ulid.Timestamp(e.now()), rand.Reader).String(), Tenant: req.Tenant,
		Selector: req.Selector, RequestedBy: req.RequestedBy, Caller: req.Caller, State: StatePending, Submitted: e.now().UTC(),
	}
	if req.ClusterID != "" {
		st.ClusterSHA256 = storage.ClusterDigest(req.Tenant, req.ClusterID)
	}
	if req.Selector != "" {
		ms, _, _ := req.matchers()
		st.Selector = redacted(req.Tenant, ms)
	}
	j := &job{req: req, status: st}
	if err := e.save(j); err != nil {
		return Status{}, err
	}
	e.mu.Lock()
	e.jobs[st.ID] = j
	e.mu.Unlock()
	e.updateGauges()
	select {
	case e.queue <- st.ID:
	default: // refused: nothing of it may stay (it would hold the tenant's shipping)
		e.mu.Lock()
		delete(e.jobs, st.ID)
		e.mu.Unlock()
		e.updateGauges()
		if err := os.Remove(e.stateFile(st.ID)); err != nil {
			e.logger.Error("remove refused erasure job", "job", st.ID, "err", err)
		}
		return Status{}, ErrQueueFull
	}
	e.logger.Info("erasure requested", "audit", true, "job", st.ID, "tenant", st.Tenant, "cluster_sha256", st.ClusterSHA256,
		"selector", st.Selector, "requested_by", st.RequestedBy, "caller", st.Caller, "deny", *req.Deny)
	return st, nil
}

// Readmit lifts the deny list entry of an erased cluster, and makes its
// unfinished jobs leave it admitted when they run (they still erase): the
// deny is applied when a job runs, and would otherwise come back after the
// re-admission.
func (e *Eraser) Readmit(tenant, clusterID, requestedBy, caller string) (bool, error) {
	e.admitMu.Lock()
	defer e.admitMu.Unlock()
	waiting, err := e.admitUnfinished(tenant, clusterID)
	if err != nil {
		return false, err
	}
	ok, err := e.local.Readmit(tenant, clusterID)
	ok = ok || waiting > 0
	if err == nil && ok {
		e.logger.Info("erased cluster re-admitted", "audit", true, "tenant", tenant,
			"cluster_sha256", storage.ClusterDigest(tenant, clusterID), "requested_by", requestedBy, "caller", caller)
	}
	return ok, err
}

// admitUnfinished turns off the deny of the cluster's unfinished jobs,
// persisted, and returns how many there were. e.admitMu must be held.
func (e *Eraser) admitUnfinished(tenant, clusterID string) (int, error) {
	var admitted []*job
	e.mu.Lock()
	for _, j := range e.jobs {
		if j.status.State != StateDone && j.req.Tenant == tenant && j.req.ClusterID == clusterID && j.req.Deny != nil && *j.req.Deny {
			j.req.Deny = new(false)
			admitted = append(admitted, j)
		}
	}
	e.mu.Unlock()
	for i, j := range admitted {
		if err := e.save(j); err != nil {
			// The unsaved jobs deny again in memory, as on disk: a retried
			// re-admission finds and saves them.
			e.mu.Lock()
			for _, u := range admitted[i:] {
				u.req.Deny = new(true)
			}
			e.mu.Unlock()
			return 0, err
		}
	}
	return len(admitted), nil
}

// deny puts a job's cluster on the deny list, unless the job asks not to
// or the cluster was re-admitted since it was taken.
func (e *Eraser) deny(j *job) error {
	e.admitMu.Lock()
	defer e.admitMu.Unlock()
	e.mu.Lock()
	deny := j.req.ClusterID != "" && j.req.Deny != nil && *j.req.Deny
	tenant, cluster, id := j.req.Tenant, j.req.ClusterID, j.status.ID
	e.mu.Unlock()
	if !deny {
		return nil
	}
	return e.local.Deny(tenant, cluster, "erasure "+id)
}

// Get returns a job's status.
func (e *Eraser) Get(id string) (Status, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j, ok := e.jobs[id]
	if !ok {
		return Status{}, false
	}
	return j.status, true
}

// List returns the tenant's jobs, oldest first.
func (e *Eraser) List(tenant string) []Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Status
	for _, j := range e.jobs {
		if j.status.Tenant == tenant {
			out = append(out, j.status)
		}
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Run runs queued jobs one at a time until ctx ends, and runs a failed job
// again after a backoff (Options.RetryMin doubling up to RetryMax) until it
// succeeds; other jobs run meanwhile. Every failure is logged at error
// level and counted. Run itself never fails.
func (e *Eraser) Run(ctx context.Context) error {
	retries := map[string]time.Time{} // failed jobs → when to run them again
	for {
		var wake <-chan time.Time
		if len(retries) > 0 {
			wake = time.After(time.Until(slices.MinFunc(slices.Collect(maps.Values(retries)), time.Time.Compare)))
		}
		select {
		case <-ctx.Done():
			return nil
		case id := <-e.queue:
			e.attempt(ctx, id, retries)
		case <-wake:
			for id, at := range retries {
				if !time.Now().Before(at) {
					delete(retries, id)
					e.attempt(ctx, id, retries)
				}
			}
		}
	}
}

// attempt runs job id; when it fails, it schedules the next attempt in
// retries.
func (e *Eraser) attempt(ctx context.Context, id string, retries map[string]time.Time) {
	err := e.Do(ctx, id)
	if err == nil || ctx.Err() != nil {
		return
	}
	e.mu.Lock()
	j, ok := e.jobs[id]
	if !ok {
		e.mu.Unlock()
		e.logger.Error("erasure failed", "job", id, "err", err)
		return
	}
	wait := e.backoff[0] << min(max(j.status.Failures-1, 0), 20)
	if wait <= 0 || wait > e.backoff[1] {
		wait = e.backoff[1]
	}
	j.status.NextAttempt = e.now().Add(wait).UTC()
	st, held := j.status, e.holdsLocked(j.status.Tenant)
	e.mu.Unlock()
	retries[id] = time.Now().Add(wait)
	e.updateGauges()
	e.logger.Error("erasure failed; retrying", "job", id, "tenant", st.Tenant, "failures", st.Failures, "retry_in", wait.String(),
		"local_done", st.LocalDone, "shipping_held", held, "err", err)
}

// Do runs job id to the end.
func (e *Eraser) Do(ctx context.Context, id string) (err error) {
	e.mu.Lock()
	j, ok := e.jobs[id]
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("no erasure job %s", id)
	}
	start := e.now()
	defer func() {
		switch {
		case err != nil && ctx.Err() != nil:
			// Stopped (shutdown), not failed: resumed at the next start
			// without counting as failing (the alert would fire for
			// nothing after a rollout).
			e.update(j, func(s *Status) { s.Error = "interrupted: " + err.Error() })
			_ = e.save(j)
		case err != nil:
			e.m.jobs.WithLabelValues("failure").Inc()
			e.update(j, func(s *Status) { s.State, s.Error, s.Failures = StateFailed, err.Error(), s.Failures+1 })
			_ = e.save(j)
		}
		e.updateGauges()
	}()
	e.mu.Lock()
	req := j.req // Readmit may turn its deny off meanwhile
	e.mu.Unlock()
	ms, forbidden, err := req.matchers()
	if err != nil {
		return err
	}
	if err := e.deny(j); err != nil {
		return fmt.Errorf("deny: %w", err)
	}
	e.mu.Lock()
	localDone := j.status.LocalDone
	e.mu.Unlock()
	if !localDone { // once done, a retry does not stop every tenant's writes again
		if err := e.eraseLocal(ctx, j, ms, forbidden); err != nil {
			return err
		}
	}
	e.update(j, func(s *Status) { s.State, s.Error = StateBucket, "" })
	if err := e.save(j); err != nil {
		return err
	}
	br, err := e.bucket.EraseBucket(ctx, j.req.Tenant, ms, forbidden, filepath.Join(e.dir, "work"), func(done, total int) {
		e.update(j, func(s *Status) { s.BlocksDone, s.BlocksTotal = done, total })
		e.m.blocksDone.Set(float64(done))
		e.m.blocksTotal.Set(float64(total))
	})
	if err != nil {
		return fmt.Errorf("bucket: %w", err)
	}
	if e.afterBucket != nil {
		if err := e.afterBucket(ctx); err != nil {
			return fmt.Errorf("after bucket: %w", err)
		}
	}
	e.forget(j)
	removed := j.pushed + j.local.Series + br.Series
	warning := nothingFound(j, removed)
	e.update(j, func(s *Status) {
		s.State, s.Finished, s.NextAttempt = StateDone, e.now().UTC(), time.Time{}
		s.SeriesRemoved, s.Warning = removed, warning
	})
	// The raw id lives only in the state file and this job's request:
	// both go now.
	e.saveMu.Lock()
	rmErr := os.Remove(e.stateFile(id))
	e.saveMu.Unlock()
	if rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		return fmt.Errorf("remove job state: %w", rmErr)
	}
	e.mu.Lock()
	j.req.ClusterID = ""
	e.mu.Unlock()
	e.m.jobs.WithLabelValues("success").Inc()
	e.m.series.Add(float64(j.pushed + j.local.Series + br.Series))
	e.logger.Info("erasure done", "audit", true, "job", id, "tenant", j.status.Tenant, "cluster_sha256", j.status.ClusterSHA256,
		"selector", j.status.Selector, "requested_by", j.status.RequestedBy, "caller", j.status.Caller, "failures", j.status.Failures,
		"series_push", j.pushed, "series_local", j.local.Series, "local_blocks_rewritten", j.local.BlocksRewritten, "local_blocks_dropped", j.local.BlocksDropped,
		"bucket_blocks", br.Blocks, "bucket_blocks_rewritten", br.Rewritten, "bucket_series", br.Series,
		"bucket_blocks_deleted", br.Deleted, "duration", e.now().Sub(start).String())
	if warning != "" {
		e.logger.Warn("erasure found nothing to erase", "job", id, "tenant", j.status.Tenant, "cluster_sha256", j.status.ClusterSHA256,
			"selector", j.status.Selector, "warning", warning)
	}
	return nil
}

// nothingFound returns the warning of a job that removed no series and
// whose cluster the limiter did not know either: most likely a mistyped
// _id (or selector). A cluster erasure still denies the cluster, as it
// must for one that has not written yet. Another replica's job running at
// the same time may have erased the bucket's copies first.
func nothingFound(j *job, removed int) string {
	switch {
	case removed > 0 || j.known:
		return ""
	case j.req.ClusterID != "":
		return "no series of this cluster were found on this replica or in the bucket: check the _id"
	}
	return "no series matched the selector on this replica or in the bucket: check the selector"
}

// forget drops the job's cluster from the limiter's memory (Limiter).
// Writes of the cluster are refused from the deny on; one admitted while
// the deny was taken is caught by the second call, at the end of the job.
func (e *Eraser) forget(j *job) {
	e.mu.Lock()
	tenant, cluster := j.req.Tenant, j.req.ClusterID
	e.mu.Unlock()
	if e.limiter == nil || cluster == "" {
		return
	}
	_, known := e.limiter.Forget(tenant, cluster)
	e.mu.Lock()
	j.known = j.known || known
	e.mu.Unlock()
}

// eraseLocal is the local step: the push state, then the head, the WAL and
// the local blocks. Once it succeeds, the job is LocalDone.
func (e *Eraser) eraseLocal(ctx context.Context, j *job, ms []*labels.Matcher, forbidden []string) error {
	e.update(j, func(s *Status) { s.State, s.Error = StateLocal, "" })
	if err := e.save(j); err != nil {
		return err
	}
	pushed := 0
	if e.pushes != nil { // first: a flush after the local step would write them back
		var err error
		if pushed, err = e.pushes.Erase(j.req.Tenant, ms); err != nil {
			return fmt.Errorf("push state: %w", err)
		}
	}
	lr, err := e.local.EraseLocal(ctx, j.req.Tenant, ms, forbidden)
	if err != nil {
		return fmt.Errorf("local: %w", err)
	}
	e.forget(j) // its series are gone: they free their budget now
	e.mu.Lock()
	defer e.mu.Unlock()
	j.pushed, j.local = pushed, lr
	j.status.SeriesRemoved, j.status.LocalDone = pushed+lr.Series, true
	return nil
}

func (e *Eraser) update(j *job, f func(*Status)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(&j.status)
}

func (e *Eraser) stateFile(id string) string { return filepath.Join(e.dir, id+".json") }

func (e *Eraser) save(j *job) error {
	e.saveMu.Lock()
	defer e.saveMu.Unlock()
	e.mu.Lock()
	if j.status.State == StateDone { // its state file is removed
		e.mu.Unlock()
		return nil
	}
	b, err := json.Marshal(state{Request: j.req, Status: j.status, Pushed: j.pushed, Local: j.local, Known: j.known})
	e.mu.Unlock()
	if err != nil {
		return err
	}
	if err := atomicfile.Write(e.stateFile(j.status.ID), b, 0o600); err != nil {
		return fmt.Errorf("save erasure job: %w", err)
	}
	return nil
}

type metrics struct {
	jobs        *prometheus.CounterVec
	unfinished  prometheus.Gauge
	failing     prometheus.Gauge
	holding     prometheus.Gauge
	blocksDone  prometheus.Gauge
	blocksTotal prometheus.Gauge
	series      prometheus.Counter
}

// updateGauges counts the unfinished jobs, those that have failed, and the
// tenants whose shipping they hold.
func (e *Eraser) updateGauges() {
	e.mu.Lock()
	defer e.mu.Unlock()
	var unfinished, failing int
	holding := map[string]bool{}
	for _, j := range e.jobs {
		if j.status.State == StateDone {
			continue
		}
		unfinished++
		if j.status.Failures > 0 { // also while a retry runs, so that alerts hold
			failing++
		}
		if !j.status.LocalDone {
			holding[j.status.Tenant] = true
		}
	}
	e.m.unfinished.Set(float64(unfinished))
	e.m.failing.Set(float64(failing))
	e.m.holding.Set(float64(len(holding)))
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		jobs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_erasure_jobs_total", Help: "Erasure job attempts, by result; a failed job is retried until it succeeds.",
		}, []string{"result"}),
		unfinished: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_erasure_jobs_unfinished", Help: "Erasure jobs submitted or resumed and not done.",
		}),
		failing: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_erasure_jobs_failing", Help: "Unfinished erasure jobs that have failed at least once; they are retried until they succeed.",
		}),
		holding: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_erasure_shipping_held_tenants",
			Help: "Tenants whose blocks are not shipped because one of their erasure jobs has not erased the local storage yet.",
		}),
		blocksDone: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_erasure_bucket_blocks_done", Help: "Bucket blocks the current (or last) erasure has examined.",
		}),
		blocksTotal: f.NewGauge(prometheus.GaugeOpts{
			Name: "phonehome_erasure_bucket_blocks", Help: "Bucket blocks the current (or last) erasure examines.",
		}),
		series: f.NewCounter(prometheus.CounterOpts{
			Name: "phonehome_erasure_series_removed_total", Help: "Series removed by erasures (counted once per block holding them).",
		}),
	}
	for _, r := range []string{"success", "failure"} {
		m.jobs.WithLabelValues(r)
	}
	return m
}
