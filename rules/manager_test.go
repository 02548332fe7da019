package rules

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/promql"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/storage"
)

// fakeStore has fixed tenants, no data, and records writes by tenant.
type fakeStore struct {
	tenants []string
	mu      sync.Mutex
	written map[string]map[string]float64 // tenant → metric name → last value
}

func (f *fakeStore) Write(_ context.Context, tenant string, series []prompb.TimeSeries) (storage.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.written == nil {
		f.written = map[string]map[string]float64{}
	}
	if f.written[tenant] == nil {
		f.written[tenant] = map[string]float64{}
	}
	for _, ts := range series {
		for _, l := range ts.Labels {
			if l.Name == model.MetricNameLabel {
				f.written[tenant][l.Value] = ts.Samples[len(ts.Samples)-1].Value
			}
		}
	}
	return storage.Stats{}, nil
}

func (f *fakeStore) Querier(string, int64, int64) (promstorage.Querier, error) {
	return promstorage.NoopQuerier(), nil
}

func (f *fakeStore) Tenants() []string { return f.tenants }

func (f *fakeStore) value(tenant, name string) (float64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.written[tenant][name]
	return v, ok
}

func eventually(t *testing.T, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		require.True(t, time.Now().Before(deadline), "condition not met in time")
		time.Sleep(20 * time.Millisecond)
	}
}

func TestManagerRecordsPerTenantAndKeepsRulesOnInvalidReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "r.yaml")
	write := func(s string) { require.NoError(t, os.WriteFile(file, []byte(s), 0o600)) }
	write("groups:\n- name: g\n  rules:\n  - record: answer\n    expr: vector(1)\n")

	store := &fakeStore{tenants: []string{"a", "b"}}
	reg := prometheus.NewRegistry()
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1000, Timeout: time.Second})
	cfg := Config{Files: []string{filepath.Join(dir, "*.yaml")}, EvaluationInterval: model.Duration(50 * time.Millisecond), ReloadInterval: model.Duration(time.Hour)}
	cfg.SetDefaults()
	// 50ms is below the 1s the config allows; fine for a unit test.
	m, err := New(slog.New(slog.DiscardHandler), reg, engine, store, cfg, Options{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	// Both tenants evaluate, each into its own storage.
	eventually(t, func() bool {
		a, okA := store.value("a", "answer")
		b, okB := store.value("b", "answer")
		return okA && okB && a == 1 && b == 1
	})

	// The API sees only the caller's tenant.
	require.Len(t, m.RulesRetriever(auth.WithIdentity(ctx, auth.Identity{Tenant: "a"})).RuleGroups(), 1)
	require.Empty(t, m.RulesRetriever(auth.WithIdentity(ctx, auth.Identity{Tenant: "nobody"})).RuleGroups())
	require.Empty(t, m.RulesRetriever(ctx).RuleGroups())

	// A broken file: every failed reload counted, previous rules kept.
	write("groups:\n- name: g\n  rules:\n  - record: answer\n    expr: vector(\n")
	require.Error(t, m.Reload())
	require.Error(t, m.Reload())
	require.Equal(t, 2.0, testutil.ToFloat64(m.metrics.reloads.WithLabelValues("failure")))
	require.Equal(t, 0.0, testutil.ToFloat64(m.metrics.lastSuccess))
	require.Equal(t, "vector(1)", m.RulesRetriever(auth.WithIdentity(ctx, auth.Identity{Tenant: "b"})).RuleGroups()[0].Rules()[0].Query().String())

	// A fixed file takes effect for every tenant.
	write("groups:\n- name: g\n  rules:\n  - record: answer\n    expr: vector(42)\n")
	require.NoError(t, m.Reload())
	require.Equal(t, 1.0, testutil.ToFloat64(m.metrics.reloads.WithLabelValues("success")))
	eventually(t, func() bool {
		a, _ := store.value("a", "answer")
		b, _ := store.value("b", "answer")
		return a == 42 && b == 42
	})
}

// Reload is called at once by Run's interval, SIGHUP and POST /-/reload:
// concurrent reloads are serialized (the race detector would see them
// share the last error reported and the snapshot's compare-and-store).
func TestConcurrentReloads(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "r.yaml")
	require.NoError(t, os.WriteFile(file, []byte("groups:\n- name: g\n  rules:\n  - record: answer\n    expr: vector(1)\n"), 0o600))
	cfg := Config{Files: []string{filepath.Join(dir, "*.yaml")}}
	cfg.SetDefaults()
	m, err := New(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), promql.NewEngine(promql.EngineOpts{}), &fakeStore{}, cfg, Options{})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				_ = m.Reload()
			}
		})
	}
	wg.Wait()
	require.NoError(t, m.Reload())
}

func TestNewRejectsInvalidRuleFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("groups:\n- name: g\n  rules:\n  - alert: X\n    expr: up ==\n"), 0o600))
	cfg := Config{Files: []string{filepath.Join(dir, "*.yaml")}}
	cfg.SetDefaults()
	require.Error(t, CheckFiles(cfg))
	_, err := New(slog.New(slog.DiscardHandler), nil, nil, &fakeStore{}, cfg, Options{})
	require.ErrorContains(t, err, "bad.yaml")
}

func TestConfigValidate(t *testing.T) {
	cfg := Config{Files: []string{"["}, Alertmanagers: []AlertmanagerConfig{{URL: "ftp://x"}}, ExternalURL: "nope", EvaluationInterval: model.Duration(time.Millisecond)}
	cfg.ReloadInterval = model.Duration(time.Second)
	err := cfg.Validate()
	require.ErrorContains(t, err, "rules.files[0]")
	require.ErrorContains(t, err, "rules.alertmanagers[0].url")
	require.ErrorContains(t, err, "rules.external_url")
	require.ErrorContains(t, err, "rules.evaluation_interval")
}

// TestEvaluateFalseAndExtraTenants: a replica with rules.evaluate false
// evaluates nothing and serves no rules; the evaluating one evaluates the
// tenants of every source (here one only a peer or the bucket knows), over
// the Reader it is given.
func TestEvaluateFalseAndExtraTenants(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "r.yaml"), []byte("groups:\n- name: g\n  rules:\n  - record: answer\n    expr: count(up) or vector(1)\n"), 0o600))
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1000, Timeout: time.Second})
	run := func(m *Manager) func() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		return func() {
			cancel()
			require.NoError(t, <-done)
		}
	}

	off := false
	cfg := Config{Files: []string{filepath.Join(dir, "*.yaml")}, EvaluationInterval: model.Duration(50 * time.Millisecond), ReloadInterval: model.Duration(time.Hour), Evaluate: &off}
	cfg.SetDefaults()
	passive := &fakeStore{tenants: []string{"a"}}
	m, err := New(slog.New(slog.DiscardHandler), nil, engine, passive, cfg, Options{})
	require.NoError(t, err)
	stop := run(m)
	require.NoError(t, m.Reload())
	require.Empty(t, m.RulesRetriever(auth.WithIdentity(context.Background(), auth.Identity{Tenant: "a"})).RuleGroups())
	stop()
	require.Empty(t, passive.written, "a passive replica writes nothing")

	on := true
	cfg.Evaluate = &on
	active := &fakeStore{tenants: []string{"a"}}
	var queried sync.Map
	reader := readerFunc(func(tenant string, _, _ int64) (promstorage.Querier, error) {
		queried.Store(tenant, true)
		return promstorage.NoopQuerier(), nil
	})
	m, err = New(slog.New(slog.DiscardHandler), nil, engine, active, cfg, Options{Reader: reader, Tenants: []func() []string{func() []string { return []string{"b", "a"} }}})
	require.NoError(t, err)
	defer run(m)()
	eventually(t, func() bool {
		_, a := active.value("a", "answer")
		_, b := active.value("b", "answer")
		return a && b
	})
	// Queries go to the given reader, for every tenant.
	_, ok := queried.Load("b")
	require.True(t, ok)
}

type readerFunc func(tenant string, mint, maxt int64) (promstorage.Querier, error)

func (f readerFunc) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	return f(tenant, mint, maxt)
}

// A receiver with no rule files, and a replica that does not evaluate
// them, load nothing: phonehome_rules_last_reload_successful is 1 there,
// as Prometheus' reload gauge is, so an alert on it stays quiet.
func TestLastReloadSuccessfulWithoutRules(t *testing.T) {
	off := false
	for name, cfg := range map[string]Config{
		"no rule files":  {},
		"not evaluating": {Files: []string{"/nonexistent/*.yaml"}, Evaluate: &off},
	} {
		cfg.SetDefaults()
		m, err := New(slog.New(slog.DiscardHandler), nil, nil, &fakeStore{}, cfg, Options{})
		require.NoError(t, err, name)
		require.Equal(t, 1.0, testutil.ToFloat64(m.metrics.lastSuccess), name)
	}
}

// phonehome_rules_evaluating says which replica evaluates: 1 there, 0 on a
// replica that leaves its rule files to another, absent without rule
// files (so PhonehomeFleetRulesNotEvaluated sees only replicas with rules).
func TestEvaluatingGauge(t *testing.T) {
	file := filepath.Join(t.TempDir(), "r.yaml")
	require.NoError(t, os.WriteFile(file, []byte("groups:\n- name: g\n  rules:\n  - record: answer\n    expr: vector(1)\n"), 0o600))
	off := false
	for name, tc := range map[string]struct {
		cfg  Config
		want string
	}{
		"no rule files": {Config{}, ""},
		"another's":     {Config{Files: []string{file}, Evaluate: &off}, "phonehome_rules_evaluating 0\n"},
		"the evaluator": {Config{Files: []string{file}}, "phonehome_rules_evaluating 1\n"},
		"named replica": {Config{Files: []string{file}, EvaluatorReplica: "r-1", replica: "r-1"}, "phonehome_rules_evaluating 1\n"},
		"another named": {Config{Files: []string{file}, EvaluatorReplica: "r-0", replica: "r-1"}, "phonehome_rules_evaluating 0\n"},
	} {
		tc.cfg.SetDefaults()
		reg := prometheus.NewRegistry()
		_, err := New(slog.New(slog.DiscardHandler), reg, nil, &fakeStore{}, tc.cfg, Options{})
		require.NoError(t, err, name)
		want := ""
		if tc.want != "" {
			want = "# HELP phonehome_rules_evaluating 1 if this replica evaluates the fleet rules, 0 if its rule files are left to another replica (rules.evaluate, rules.evaluator_replica). Absent without rule files.\n# TYPE phonehome_rules_evaluating gauge\n" + tc.want
		}
		require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "phonehome_rules_evaluating"), name)
	}
}
