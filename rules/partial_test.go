package rules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/promql"
	promrules "github.com/prometheus/prometheus/rules"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/internal/logbuf"
	"github.com/phonehome/phonehome/storage"
)

// fleetReader is the fleet view as peers.Reader builds it: this replica's
// data (cluster a) as the primary of a merge, a peer's (cluster b) as a
// secondary. While down, the peer's Select fails as an unreachable peer's
// does, which the merge turns into a warning.
type fleetReader struct {
	local, peer *tsdb.DB
	down        atomic.Bool
}

func (r *fleetReader) Querier(_ string, mint, maxt int64) (promstorage.Querier, error) {
	lq, err := r.local.Querier(mint, maxt)
	if err != nil {
		return nil, err
	}
	var pq promstorage.Querier = deadPeer{}
	if !r.down.Load() {
		if pq, err = r.peer.Querier(mint, maxt); err != nil {
			return nil, err
		}
	}
	return promstorage.NewMergeQuerier([]promstorage.Querier{lq}, []promstorage.Querier{pq}, promstorage.ChainedSeriesMerge), nil
}

// deadPeer fails as peers' querier of an unreachable peer does.
type deadPeer struct{}

var errDeadPeer = fmt.Errorf("peer 10.0.3.7:9291 unavailable, its data is missing: %w", errors.New("remote_read: connection refused"))

func (deadPeer) Select(context.Context, bool, *promstorage.SelectHints, ...*labels.Matcher) promstorage.SeriesSet {
	return promstorage.ErrSeriesSet(errDeadPeer)
}

func (deadPeer) LabelValues(context.Context, string, *promstorage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, errDeadPeer
}

func (deadPeer) LabelNames(context.Context, *promstorage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, errDeadPeer
}

func (deadPeer) Close() error { return nil }

// clusterDB holds up{_id=id} every 15s around now, so that evaluations in
// the next minutes see it.
func clusterDB(t *testing.T, id string) *tsdb.DB {
	t.Helper()
	db, err := tsdb.Open(t.TempDir(), nil, nil, tsdb.DefaultOptions(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	app := db.Appender(context.Background())
	now := time.Now()
	for ts := now.Add(-2 * time.Minute); ts.Before(now.Add(3 * time.Minute)); ts = ts.Add(15 * time.Second) {
		_, err := app.Append(0, labels.FromStrings(model.MetricNameLabel, "up", "_id", id), ts.UnixMilli(), 1)
		require.NoError(t, err)
	}
	require.NoError(t, app.Commit())
	return db
}

// historyStore records every value written, by metric name.
type historyStore struct {
	mu     sync.Mutex
	values map[string][]float64
}

func (s *historyStore) Write(_ context.Context, _ string, series []prompb.TimeSeries) (storage.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.values == nil {
		s.values = map[string][]float64{}
	}
	for _, ts := range series {
		for _, l := range ts.Labels {
			if l.Name == model.MetricNameLabel {
				for _, smp := range ts.Samples {
					s.values[l.Value] = append(s.values[l.Value], smp.Value)
				}
			}
		}
	}
	return storage.Stats{}, nil
}

func (s *historyStore) Querier(string, int64, int64) (promstorage.Querier, error) {
	return promstorage.NoopQuerier(), nil
}

func (s *historyStore) Tenants() []string { return []string{"acme"} }

func (s *historyStore) written(name string) []float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]float64(nil), s.values[name]...)
}

// startFleetRules runs a Manager with rules over reader, evaluated every
// 50ms for tenant acme, sending alerts to the Alertmanager at amURL (if not
// empty) with a resend delay of 200ms, and a partial `for` state read again
// after 20ms. It returns the manager, the store and a stop func.
func startFleetRules(t *testing.T, rules string, reader Reader, logs *logbuf.Buffer, amURL string) (*Manager, *historyStore, func()) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fleet.yaml"), []byte(rules), 0o600))
	cfg := Config{Files: []string{filepath.Join(dir, "*.yaml")}, EvaluationInterval: model.Duration(50 * time.Millisecond), ReloadInterval: model.Duration(time.Hour)}
	if amURL != "" {
		cfg.Alertmanagers = []AlertmanagerConfig{{URL: amURL}}
	}
	cfg.SetDefaults()
	store := &historyStore{}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 10000, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute})
	m, err := New(slog.New(slog.NewTextHandler(logs, nil)), nil, engine, store, cfg, Options{Reader: reader})
	require.NoError(t, err)
	m.resendDelay = 200 * time.Millisecond
	m.restoreRetryWait = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return m, store, stop
}

func alertByName(m *Manager, name string) *promrules.AlertingRule {
	for _, r := range m.RulesRetriever(auth.WithIdentity(context.Background(), auth.Identity{Tenant: "acme"})).AlertingRules() {
		if r.Name() == name {
			return r
		}
	}
	return nil
}

// TestPartialDataSkipsEvaluation: while a peer is unreachable, the fleet
// query answers with the rest and a warning. The rules must not record
// that answer, and alerts keep their state (a firing one stays firing, a
// pending one keeps its `for` timer).
func TestPartialDataSkipsEvaluation(t *testing.T) {
	reader := &fleetReader{local: clusterDB(t, "a"), peer: clusterDB(t, "b")}
	logs := &logbuf.Buffer{}
	m, store, stop := startFleetRules(t, `groups:
- name: fleet
  rules:
  - record: clusters_reporting:count
    expr: count(up)
  - alert: FleetComplete
    expr: count(up) >= 2
  - alert: FleetCompleteForAnHour
    expr: count(up) >= 2
    for: 1h
`, reader, logs, "")

	eventually(t, func() bool {
		firing, pending := alertByName(m, "FleetComplete"), alertByName(m, "FleetCompleteForAnHour")
		return len(store.written("clusters_reporting:count")) > 0 &&
			firing != nil && firing.State() == promrules.StateFiring &&
			pending != nil && pending.State() == promrules.StatePending
	})
	activeAt := alertByName(m, "FleetCompleteForAnHour").ActiveAlerts()[0].ActiveAt

	// Wait on the skips themselves: counting queries would also count the
	// `for` state restore's, which Prometheus runs after the second
	// evaluation, and then fall short of three skipped evaluations.
	reader.down.Store(true)
	eventually(t, func() bool { return testutil.ToFloat64(m.metrics.partial) >= 9 }) // three evaluations of three rules

	for _, v := range store.written("clusters_reporting:count") {
		require.Equal(t, 2.0, v, "a count over partial data was recorded")
	}
	require.Equal(t, promrules.StateFiring, alertByName(m, "FleetComplete").State())
	pending := alertByName(m, "FleetCompleteForAnHour").ActiveAlerts()
	require.Len(t, pending, 1)
	require.Equal(t, activeAt, pending[0].ActiveAt, "the for timer restarted")
	require.ErrorContains(t, alertByName(m, "FleetComplete").LastError(), "peer 10.0.3.7:9291 unavailable")

	// Back to complete data: recorded again.
	reader.down.Store(false)
	n := len(store.written("clusters_reporting:count"))
	eventually(t, func() bool { return len(store.written("clusters_reporting:count")) > n })
	stop()

	skipped := testutil.ToFloat64(m.metrics.partial)
	require.GreaterOrEqual(t, skipped, 9.0)
	// Logged by the group at Warn, once per skipped rule evaluation.
	require.Equal(t, int(skipped), strings.Count(logs.String(), "evaluation skipped: partial data: peer 10.0.3.7:9291 unavailable"), logs.String())
	require.Contains(t, logs.String(), "level=WARN")
}

// TestPromQLAnnotationsDoNotSkipEvaluation: rate over a metric not named
// like a counter gets PromQL's "possible non-counter" info; that says
// nothing about missing data, so the rule is recorded as usual.
func TestPromQLAnnotationsDoNotSkipEvaluation(t *testing.T) {
	reader := &fleetReader{local: clusterDB(t, "a"), peer: clusterDB(t, "b")}

	// The query does carry the info annotation.
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 10000, Timeout: 10 * time.Second})
	ctx := auth.WithIdentity(context.Background(), auth.Identity{Tenant: "acme"})
	q, err := engine.NewInstantQuery(ctx, promstorage.QueryableFunc(func(mint, maxt int64) (promstorage.Querier, error) {
		return reader.Querier("acme", mint, maxt)
	}), nil, "sum(rate(up[5m]))", time.Now())
	require.NoError(t, err)
	res := q.Exec(ctx)
	require.NoError(t, res.Err)
	_, infos := res.Warnings.AsStrings("", 0, 0)
	require.NotEmpty(t, infos)
	q.Close()

	m, store, stop := startFleetRules(t, `groups:
- name: fleet
  rules:
  - record: up:rate5m
    expr: sum(rate(up[5m]))
`, reader, &logbuf.Buffer{}, "")
	eventually(t, func() bool { return len(store.written("up:rate5m")) >= 2 })
	stop()
	require.Zero(t, testutil.ToFloat64(m.metrics.partial))
}

// alertSink records the alerts Prometheus' notifier posts, as an
// Alertmanager's /api/v2/alerts receives them.
type alertSink struct {
	mu    sync.Mutex
	posts []sentAlert
}

type sentAlert struct {
	Labels   map[string]string `json:"labels"`
	EndsAt   time.Time         `json:"endsAt"`
	received time.Time
}

func (s *alertSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var alerts []sentAlert
	if r.URL.Path != "/api/v2/alerts" || json.NewDecoder(r.Body).Decode(&alerts) != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range alerts {
		a.received = time.Now()
		s.posts = append(s.posts, a)
	}
}

// sent returns the posts of alert name received after since.
func (s *alertSink) sent(name string, since time.Time) []sentAlert {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sentAlert
	for _, a := range s.posts {
		if a.Labels[model.AlertNameLabel] == name && a.received.After(since) {
			out = append(out, a)
		}
	}
	return out
}

// TestPartialDataResendsFiringAlerts: a firing alert whose rule skips its
// evaluations (a peer unreachable) is still sent once per resend delay, each
// time valid for four resend delays, so that Alertmanager does not resolve
// it while the data is partial. Pending alerts are not sent.
func TestPartialDataResendsFiringAlerts(t *testing.T) {
	m, sink, reader, stop := startFleetAlerts(t)
	start := time.Now()
	// A resend delay is 200ms: three sends while the rule skips (the
	// evaluations before the fix sent none; eventually fails after 20s).
	resent := resentWhileSkipping(t, m, sink, func() { reader.down.Store(true) })
	require.True(t, errors.Is(alertByName(m, "FleetComplete").LastError(), errSkipped), "the peer came back by itself")
	for _, a := range resent {
		require.Equal(t, "acme", a.Labels[TenantLabel])
		require.True(t, a.EndsAt.After(a.received.Add(500*time.Millisecond)), "sent valid until %v, received %v", a.EndsAt, a.received)
	}
	require.Empty(t, sink.sent("FleetCompleteForAnHour", start), "a pending alert was sent")
	stop()
}

// resentWhileSkipping waits until FleetComplete fires and is sent, breaks
// the peer, waits until the rule skips its evaluations and three sends
// arrived since, and returns those sends.
func resentWhileSkipping(t *testing.T, m *Manager, sink *alertSink, breakPeer func()) []sentAlert {
	t.Helper()
	start := time.Now()
	eventually(t, func() bool { return len(sink.sent("FleetComplete", start)) > 0 })
	breakPeer()
	eventually(t, func() bool { return errors.Is(alertByName(m, "FleetComplete").LastError(), errSkipped) })
	skipping := time.Now()
	eventually(t, func() bool { return len(sink.sent("FleetComplete", skipping)) >= 3 })
	return sink.sent("FleetComplete", skipping)
}

// TestTwoEvaluatorsSendIdenticalAlerts: two replicas evaluating the same
// rules (rules.evaluate on both, a misconfiguration docs/rules.md allows
// for) send each alert with the same labels, so that Alertmanager takes
// them for one alert: no replica or other external label tells them apart.
func TestTwoEvaluatorsSendIdenticalAlerts(t *testing.T) {
	sink := &alertSink{}
	am := httptest.NewServer(sink)
	t.Cleanup(am.Close)
	reader := &fleetReader{local: clusterDB(t, "a"), peer: clusterDB(t, "b")}
	const rules = `groups:
- name: fleet
  rules:
  - alert: FleetComplete
    expr: count(up) >= 2
    labels: {severity: warning}
`
	start := time.Now()
	_, _, stopA := startFleetRules(t, rules, reader, &logbuf.Buffer{}, am.URL)
	_, _, stopB := startFleetRules(t, rules, reader, &logbuf.Buffer{}, am.URL)
	eventually(t, func() bool { return len(sink.sent("FleetComplete", start)) >= 4 })
	stopA()
	stopB()
	distinct := map[string]bool{}
	for _, a := range sink.sent("FleetComplete", start) {
		distinct[fmt.Sprint(a.Labels)] = true
	}
	require.Equal(t, map[string]bool{"map[alertname:FleetComplete severity:warning tenant:acme]": true}, distinct)
}

// TestGracefulStopKeepsFiringAlertsThroughARestart: as the evaluator stops
// (a rolling update), its firing alerts are sent once more, valid until a
// restarted evaluator sends them again (its third evaluation, after the
// shutdown and the start), so that Alertmanager does not resolve them
// meanwhile.
func TestGracefulStopKeepsFiringAlertsThroughARestart(t *testing.T) {
	_, sink, _, stop := startFleetAlerts(t)
	start := time.Now()
	eventually(t, func() bool { return len(sink.sent("FleetComplete", start)) > 0 })
	stopped := time.Now()
	stop()

	// 4 × the 200ms resend delay, 3 × the 50ms interval, the allowance. The
	// notifier's drain at its stop does not wait for a batch in flight, so
	// the last send may arrive after the stop.
	want := stopped.Add(800*time.Millisecond + 150*time.Millisecond + restartAllowance - time.Second)
	eventually(t, func() bool {
		for _, a := range sink.sent("FleetComplete", start) {
			if !a.EndsAt.Before(want) {
				return true
			}
		}
		return false
	})
	require.Empty(t, sink.sent("FleetCompleteForAnHour", start), "a pending alert was sent")
}

// TestAlertValidityDefaults: docs/rules.md's figures for the defaults (a 1m
// evaluation interval and resend delay): a sent alert stays active in
// Alertmanager for 4 minutes, one sent as the evaluator stops gracefully
// for 10.
func TestAlertValidityDefaults(t *testing.T) {
	evaluate := false // nothing to load: the defaults only
	cfg := Config{Evaluate: &evaluate}
	cfg.SetDefaults()
	m, err := New(slog.New(slog.DiscardHandler), nil, nil, &historyStore{}, cfg, Options{})
	require.NoError(t, err)
	interval := time.Duration(cfg.EvaluationInterval)
	require.Equal(t, 4*time.Minute, validity(interval, m.resendDelay))
	require.Equal(t, 10*time.Minute, restartValidity(interval, m.resendDelay))
}

// TestRestoreRetryDefaults: docs/rules.md's figures for a `for` state read
// that gets partial data: read again 5 s later, then 10 s later, so 3 reads
// and at most 15 s of waiting per group (TestRestoreRereadsPartialAnswers checks the
// doubling and the bound as multiples of the wait).
func TestRestoreRetryDefaults(t *testing.T) {
	evaluate := false // nothing to load: the defaults only
	cfg := Config{Evaluate: &evaluate}
	cfg.SetDefaults()
	m, err := New(slog.New(slog.DiscardHandler), nil, nil, &historyStore{}, cfg, Options{})
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, m.restoreRetryWait)
	require.Equal(t, 3, restoreReads)
}

// startFleetAlerts runs FleetComplete (firing while both clusters report)
// and FleetCompleteForAnHour (pending meanwhile) over a fleetReader, sending
// to an alertSink.
func startFleetAlerts(t *testing.T) (*Manager, *alertSink, *fleetReader, func()) {
	t.Helper()
	sink := &alertSink{}
	am := httptest.NewServer(sink)
	t.Cleanup(am.Close)
	reader := &fleetReader{local: clusterDB(t, "a"), peer: clusterDB(t, "b")}
	m, _, stop := startFleetRules(t, `groups:
- name: fleet
  rules:
  - alert: FleetComplete
    expr: count(up) >= 2
  - alert: FleetCompleteForAnHour
    expr: count(up) >= 2
    for: 1h
`, reader, &logbuf.Buffer{}, am.URL)
	return m, sink, reader, stop
}
