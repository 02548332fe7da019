package gathering

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
)

// tenantFiles writes a default definition (unless def is empty) and one per
// tenant into a temporary directory.
func tenantFiles(t *testing.T, def string, tenants map[string]string) Files {
	t.Helper()
	dir := t.TempDir()
	f := Files{Tenants: map[string]string{}}
	if def != "" {
		f.Default = filepath.Join(dir, "default.yaml")
		writeDef(t, f.Default, def)
	}
	for tenant, body := range tenants {
		f.Tenants[tenant] = filepath.Join(dir, tenant+".yaml")
		writeDef(t, f.Tenants[tenant], body)
	}
	return f
}

// acceptedUntil returns until when a's previous versions accept the series
// named name (the latest of their Untils), or the zero time if none does.
func acceptedUntil(a Allowlists, name string) time.Time {
	var until time.Time
	for _, p := range a.Prev {
		if p.Allow.Allows(labels.FromStrings("__name__", name)) && p.Until.After(until) {
			until = p.Until
		}
	}
	return until
}

func TestServerPerTenantServing(t *testing.T) {
	f := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{
		"a": "version: a1\nselectors: [a_metric]\n",
		"b": "version: b1\nselectors: [b_metric]\n",
	})
	s, err := NewServer(discard(), prometheus.NewRegistry(), f, ServerOptions{})
	require.NoError(t, err)

	etags := map[string]string{}
	for tenant, want := range map[string]string{"a": "a1", "b": "b1", "other": "d1"} {
		w := getAs(t, s, tenant, "")
		require.Equal(t, http.StatusOK, w.Code, tenant)
		d, err := Decode(w.Body.Bytes())
		require.NoError(t, err)
		require.Equal(t, want, d.Version, tenant)
		etags[tenant] = w.Header().Get("ETag")
		require.Equal(t, "Authorization", w.Header().Get("Vary"))

		w = getAs(t, s, tenant, etags[tenant])
		require.Equal(t, http.StatusNotModified, w.Code, tenant)
		require.Zero(t, w.Body.Len())
	}
	require.Len(t, map[string]bool{etags["a"]: true, etags["b"]: true, etags["other"]: true}, 3, "one ETag per definition")
	require.Equal(t, http.StatusOK, getAs(t, s, "b", etags["a"]).Code, "a's ETag is not b's")
	require.Equal(t, http.StatusOK, getAs(t, s, "other", etags["a"]).Code)
	require.Equal(t, 1.0, testutil.ToFloat64(s.info.WithLabelValues("a", "a1", etags["a"])))
	require.Equal(t, 1.0, testutil.ToFloat64(s.info.WithLabelValues(DefaultTenant, "d1", etags["other"])))

	def, tenants := s.Allowlists()
	require.True(t, def.Cur.Allows(labels.FromStrings("__name__", "up")))
	require.True(t, tenants["a"].Cur.Allows(labels.FromStrings("__name__", "a_metric")))
	require.False(t, tenants["b"].Cur.Allows(labels.FromStrings("__name__", "a_metric")))
}

func TestServerNoDefault404(t *testing.T) {
	s, err := NewServer(discard(), prometheus.NewRegistry(), tenantFiles(t, "", map[string]string{"a": "version: a1\nselectors: [a_metric]\n"}), ServerOptions{})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, getAs(t, s, "a", "").Code)
	w := getAs(t, s, "other", "*")
	require.Equal(t, http.StatusNotFound, w.Code)
	require.Contains(t, w.Body.String(), `no gathering definition for tenant "other"`)
	require.Equal(t, 1.0, testutil.ToFloat64(s.requests.WithLabelValues("404")))
	def, _ := s.Allowlists()
	require.Nil(t, def)
	require.Nil(t, s.Current("other"))

	_, err = NewServer(discard(), nil, Files{}, ServerOptions{})
	require.Error(t, err)
}

func TestServerPerTenantReload(t *testing.T) {
	f := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{
		"a": "version: a1\nselectors: [a_metric]\n",
		"b": "version: b1\nselectors: [b_metric]\n",
	})
	changes := 0
	s, err := NewServer(discard(), prometheus.NewRegistry(), f, ServerOptions{GracePeriod: time.Hour, OnChange: func() { changes++ }})
	require.NoError(t, err)
	etagB := s.Current("b").ETag

	// a changes, b's new file is invalid: a moves on, b keeps b1, each counted under its tenant.
	writeDef(t, f.Tenants["a"], "version: a2\nselectors: [a_new]\n")
	writeDef(t, f.Tenants["b"], "version: b2\nselectors: ['b_metric{']\n")
	require.ErrorContains(t, s.Reload(), f.Tenants["b"])
	require.Equal(t, 1, changes, "one OnChange per Reload")
	require.Equal(t, "a2", s.Current("a").Def.Version)
	require.Equal(t, "b1", s.Current("b").Def.Version)
	require.Equal(t, etagB, getAs(t, s, "b", "").Header().Get("ETag"))
	require.Equal(t, "d1", s.Current("other").Def.Version)
	require.Equal(t, 1.0, testutil.ToFloat64(s.reloads.WithLabelValues("a", "success")))
	require.Equal(t, 0.0, testutil.ToFloat64(s.reloads.WithLabelValues("a", "failure")))
	require.Equal(t, 1.0, testutil.ToFloat64(s.reloads.WithLabelValues("b", "failure")))
	require.Equal(t, 0.0, testutil.ToFloat64(s.reloads.WithLabelValues(DefaultTenant, "failure")))
	require.Equal(t, 3, testutil.CollectAndCount(s.info), "one info series per tenant: a1's is gone")
	require.Equal(t, 1.0, testutil.ToFloat64(s.info.WithLabelValues("a", "a2", s.Current("a").ETag)))

	_, tenants := s.Allowlists()
	require.Len(t, tenants["a"].Prev, 1, "a1 in its grace period")
	require.Empty(t, tenants["b"].Prev, "b did not change")

	// Fixed later: b moves on.
	writeDef(t, f.Tenants["b"], "version: b2\nselectors: [b_metric, b_new]\n")
	require.NoError(t, s.Reload())
	require.Equal(t, 2, changes)
	require.Equal(t, "b2", s.Current("b").Def.Version)
}

func TestServerGracePeriodSurvivesRestart(t *testing.T) {
	f := tenantFiles(t, "version: d1\nselectors: [up]\n", map[string]string{"a": "version: a1\nselectors: [a_metric]\n"})
	stateDir := filepath.Join(t.TempDir(), "gathering")
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	open := func() *Server {
		t.Helper()
		s, err := NewServer(discard(), prometheus.NewRegistry(), f, ServerOptions{GracePeriod: time.Hour, StateDir: stateDir, Now: clock})
		require.NoError(t, err)
		return s
	}
	is := func(l interface{ Allows(labels.Labels) bool }, name string) bool {
		return l.Allows(labels.FromStrings("__name__", name))
	}

	s := open()
	require.FileExists(t, filepath.Join(stateDir, "default.json"))
	require.FileExists(t, filepath.Join(stateDir, "tenants", "a.json"))
	writeDef(t, f.Tenants["a"], "version: a2\nselectors: [a_new]\n")
	require.NoError(t, s.Reload())
	changedAt := now

	// Restart 10 minutes later: a1 is still accepted until an hour after the change.
	now = now.Add(10 * time.Minute)
	s = open()
	require.Equal(t, "a2", s.Current("a").Def.Version)
	def, tenants := s.Allowlists()
	require.Empty(t, def.Prev, "the default never changed")
	a := tenants["a"]
	require.True(t, is(a.Cur, "a_new"))
	require.Equal(t, changedAt.Add(time.Hour), acceptedUntil(a, "a_metric"), "the grace period counts from the change, not the restart")
	require.Equal(t, changedAt.Add(time.Hour), acceptedUntil(a, "up"), "the default a was served before a1, as long")

	// The file changes while the receiver is down: what was in force (a2)
	// is replaced at the restart; a1 stays until its own grace ends.
	writeDef(t, f.Tenants["a"], "version: a3\nselectors: [a_third]\n")
	now = now.Add(5 * time.Minute)
	s = open()
	a = func() Allowlists { _, ts := s.Allowlists(); return ts["a"] }()
	require.Equal(t, "a3", s.Current("a").Def.Version)
	require.Len(t, a.Prev, 3)
	require.Equal(t, now.Add(time.Hour), acceptedUntil(a, "a_new"))
	require.Equal(t, changedAt.Add(time.Hour), acceptedUntil(a, "a_metric"))

	// An unusable state file is ignored (and replaced): no previous version.
	require.NoError(t, os.WriteFile(filepath.Join(stateDir, "tenants", "a.json"), []byte("{not json"), 0o600))
	s = open()
	_, tenants = s.Allowlists()
	require.Empty(t, tenants["a"].Prev)
	var ps persistedState
	b, err := os.ReadFile(filepath.Join(stateDir, "tenants", "a.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &ps))
	require.JSONEq(t, string(s.Current("a").Body), string(ps.Current))
	entries, err := os.ReadDir(filepath.Join(stateDir, "tenants"))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary files left behind")
}

// TestServerTenantMovedOffTheDefaultKeepsItsGrace: a tenant given its own
// definition (read at start: a restart) was served the default until then,
// and its forwarders keep gathering the default's selectors until they poll:
// those are accepted for the grace period, as after any other change.
func TestServerTenantMovedOffTheDefaultKeepsItsGrace(t *testing.T) {
	stateDir := t.TempDir()
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	opts := ServerOptions{StateDir: stateDir, GracePeriod: time.Hour, Now: func() time.Time { return now }}
	const def = "version: d1\nselectors: [up, shared_metric]\n"
	s, err := NewServer(discard(), prometheus.NewRegistry(), tenantFiles(t, def, nil), opts)
	require.NoError(t, err)
	require.Equal(t, "d1", s.Current("acme").Def.Version)

	now = now.Add(time.Minute)
	s, err = NewServer(discard(), prometheus.NewRegistry(), tenantFiles(t, def, map[string]string{"acme": "version: a1\nselectors: [acme_metric]\n"}), opts)
	require.NoError(t, err)
	_, tenants := s.Allowlists()
	a := tenants["acme"]
	require.False(t, a.Cur.Allows(labels.FromStrings("__name__", "up")))
	require.Len(t, a.Prev, 1, "the default's selectors are accepted meanwhile")
	require.True(t, a.Prev[0].Allow.Allows(labels.FromStrings("__name__", "up")))
	require.Equal(t, now.Add(time.Hour), a.Prev[0].Until)

	// ...and only then: a restart later keeps the same grace, not a new one.
	now = now.Add(10 * time.Minute)
	s, err = NewServer(discard(), prometheus.NewRegistry(), tenantFiles(t, def, map[string]string{"acme": "version: a1\nselectors: [acme_metric]\n"}), opts)
	require.NoError(t, err)
	_, tenants = s.Allowlists()
	require.Len(t, tenants["acme"].Prev, 1)
	require.Equal(t, now.Add(-10*time.Minute).Add(time.Hour), tenants["acme"].Prev[0].Until)
}
