package receive

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/gathering"
)

func TestPolicyWithGathering(t *testing.T) {
	mustList := func(sel ...string) *allowlist.List {
		l, err := allowlist.Parse(sel)
		require.NoError(t, err)
		return l
	}
	series := func(name string) []prompb.Label { return []prompb.Label{{Name: "__name__", Value: name}} }
	base, err := NewPolicy(&Config{Allowlist: []string{"static_metric"}})
	require.NoError(t, err)
	open, err := NewPolicy(&Config{})
	require.NoError(t, err)
	def := func(cur string) *gathering.Allowlists { return &gathering.Allowlists{Cur: mustList(cur)} }
	perTenant := map[string]gathering.Allowlists{
		"a": {Cur: mustList("a_metric")},
		"b": {Cur: mustList("b_metric"), Prev: []gathering.Previous{{Allow: mustList("b_old"), Until: time.Now().Add(time.Hour)}}},
	}

	type check struct {
		tenant             string
		allowed, forbidden []string
	}
	for _, tc := range []struct {
		name   string
		p      *Policy
		checks []check
	}{
		{"no definition, no allowlist", open, []check{{"x", []string{"anything"}, nil}}},
		{"definition only", open.WithGathering(def("cur"), nil), []check{
			{"x", []string{"cur", gathering.InfoMetric}, []string{"anything", "static_metric"}},
		}},
		{"definition and config allowlist", base.WithGathering(def("cur"), nil), []check{
			{"x", []string{"cur", "static_metric", gathering.InfoMetric}, []string{"anything"}},
		}},
		{"previous within grace", open.WithGathering(&gathering.Allowlists{Cur: mustList("cur"), Prev: []gathering.Previous{{Allow: mustList("old"), Until: time.Now().Add(time.Hour)}}}, nil), []check{
			{"x", []string{"cur", "old"}, []string{"anything"}},
		}},
		{"previous after grace", open.WithGathering(&gathering.Allowlists{Cur: mustList("cur"), Prev: []gathering.Previous{{Allow: mustList("old"), Until: time.Now().Add(-time.Second)}}}, nil), []check{
			{"x", []string{"cur"}, []string{"old"}},
		}},
		{"several previous versions, each until its own end", open.WithGathering(&gathering.Allowlists{Cur: mustList("cur"), Prev: []gathering.Previous{
			{Allow: mustList("newer"), Until: time.Now().Add(time.Hour)},
			{Allow: mustList("ended"), Until: time.Now().Add(-time.Second)},
			{Allow: mustList("older"), Until: time.Now().Add(time.Minute)},
		}}, nil), []check{
			{"x", []string{"cur", "newer", "older"}, []string{"ended", "anything"}},
		}},
		{"removed tenant without a default", base.WithGathering(nil, map[string]gathering.Allowlists{
			"gone": {Prev: []gathering.Previous{{Allow: mustList("gone_metric"), Until: time.Now().Add(time.Hour)}}},
		}), []check{
			{"gone", []string{"gone_metric", "static_metric", gathering.InfoMetric}, []string{"anything"}},
			{"other", []string{"static_metric"}, []string{"gone_metric", "anything"}},
		}},
		{"removed tenant without a default nor allowlist", open.WithGathering(nil, map[string]gathering.Allowlists{
			"gone": {Prev: []gathering.Previous{{Allow: mustList("gone_metric"), Until: time.Now().Add(time.Hour)}}},
		}), []check{
			{"gone", []string{"gone_metric", "anything"}, nil}, // no definition in force: as any tenant without one
		}},
		{"per tenant with a default", open.WithGathering(def("cur"), perTenant), []check{
			{"a", []string{"a_metric", gathering.InfoMetric}, []string{"b_metric", "b_old", "cur"}},
			{"b", []string{"b_metric", "b_old"}, []string{"a_metric", "cur"}},
			{"other", []string{"cur"}, []string{"a_metric", "b_metric", "b_old"}},
		}},
		{"per tenant without a default", base.WithGathering(nil, perTenant), []check{
			{"a", []string{"a_metric", "static_metric"}, []string{"b_metric", "anything"}},
			{"other", []string{"static_metric"}, []string{"a_metric", "b_metric", "anything"}}, // only the config's allowlist
		}},
		{"per tenant, nothing else", open.WithGathering(nil, perTenant), []check{
			{"a", []string{"a_metric"}, []string{"b_metric", "anything"}},
			{"other", []string{"anything", "a_metric"}, nil},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, c := range tc.checks {
				for _, n := range c.allowed {
					require.True(t, tc.p.allows(c.tenant, series(n)), "%s: %s", c.tenant, n)
				}
				for _, n := range c.forbidden {
					require.False(t, tc.p.allows(c.tenant, series(n)), "%s: %s", c.tenant, n)
				}
			}
		})
	}
}

// Through the write path: each tenant is held to its own definition (and
// the default to the others), and a change of one tenant's file only
// changes what that tenant may write.
func TestHandlerEnforcesTheTenantsGatheringDefinition(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	files := gathering.Files{
		Default: write("default.yaml", "version: d1\nselectors: [default_metric]\n"),
		Tenants: map[string]string{"a": write("a.yaml", "version: a1\nselectors: [a_metric]\n")},
	}
	w := &fakeWriter{}
	h := NewHandler(discard(), nil, w, newLimiter(nil), Options{})
	base, err := NewPolicy(&Config{})
	require.NoError(t, err)
	var u *PolicyUpdater
	defs, err := gathering.NewServer(discard(), nil, files, gathering.ServerOptions{GracePeriod: time.Hour, OnChange: func() { u.GatheringChanged() }})
	require.NoError(t, err)
	u = NewPolicyUpdater(h, base, defs)

	post := func(tenant, name string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(encode(t, series(name)), &auth.Identity{Tenant: tenant}))
		return rec.Code
	}
	require.Equal(t, http.StatusNoContent, post("a", "a_metric"))
	require.Equal(t, http.StatusBadRequest, post("a", "default_metric"), "a has its own definition")
	require.Equal(t, http.StatusBadRequest, post("b", "a_metric"), "a's definition does not admit b's series")
	require.Equal(t, http.StatusNoContent, post("b", "default_metric"))

	// a's file changes: a_metric stays accepted for the grace period, b is unaffected.
	write("a.yaml", "version: a2\nselectors: [a_new]\n")
	require.NoError(t, defs.Reload())
	require.Equal(t, http.StatusNoContent, post("a", "a_new"))
	require.Equal(t, http.StatusNoContent, post("a", "a_metric"), "previous version within the grace period")
	require.Equal(t, http.StatusBadRequest, post("b", "a_new"))
	require.Equal(t, http.StatusBadRequest, post("b", "a_metric"))
}

// Through the write path and restarts: A→B→C keeps A's series accepted,
// and a tenant whose own file is removed keeps its last definition
// accepted on top of the default's selectors.
func TestHandlerGatheringGraceAcrossChangesAndRemoval(t *testing.T) {
	dir, stateDir := t.TempDir(), t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	withA := gathering.Files{
		Default: write("default.yaml", "version: d1\nselectors: [default_metric]\n"),
		Tenants: map[string]string{"a": write("a.yaml", "version: a1\nselectors: [a_metric]\n")},
	}
	open := func(files gathering.Files) (*gathering.Server, func(tenant, name string) int) {
		t.Helper()
		h := NewHandler(discard(), nil, &fakeWriter{}, newLimiter(nil), Options{})
		base, err := NewPolicy(&Config{})
		require.NoError(t, err)
		var u *PolicyUpdater
		defs, err := gathering.NewServer(discard(), nil, files, gathering.ServerOptions{
			GracePeriod: time.Hour, StateDir: stateDir, OnChange: func() { u.GatheringChanged() },
		})
		require.NoError(t, err)
		u = NewPolicyUpdater(h, base, defs)
		return defs, func(tenant, name string) int {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, newRequest(encode(t, series(name)), &auth.Identity{Tenant: tenant}))
			return rec.Code
		}
	}

	defs, post := open(withA)
	write("a.yaml", "version: a2\nselectors: [a_typo]\n")
	require.NoError(t, defs.Reload())
	write("a.yaml", "version: a3\nselectors: [a_third]\n")
	require.NoError(t, defs.Reload())
	require.Equal(t, http.StatusNoContent, post("a", "a_third"))
	require.Equal(t, http.StatusNoContent, post("a", "a_metric"), "a1, two changes ago, within its grace period")
	require.Equal(t, http.StatusNoContent, post("a", "a_typo"))
	require.Equal(t, http.StatusBadRequest, post("a", "anything"))

	_, post = open(withA) // restart
	require.Equal(t, http.StatusNoContent, post("a", "a_metric"), "across a restart")

	// a's file is removed: restart.
	_, post = open(gathering.Files{Default: withA.Default})
	require.Equal(t, http.StatusNoContent, post("a", "default_metric"), "the default's selectors")
	require.Equal(t, http.StatusNoContent, post("a", "a_third"), "its last own definition")
	require.Equal(t, http.StatusNoContent, post("a", "a_metric"), "and the versions before it")
	require.Equal(t, http.StatusBadRequest, post("a", "anything"))
	require.Equal(t, http.StatusBadRequest, post("b", "a_third"), "not another tenant's")
}
