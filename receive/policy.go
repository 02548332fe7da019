package receive

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/labelhash"
	"github.com/phonehome/phonehome/limits"
)

// Policy is what the server keeps of each series: its allowlist (nil allows
// everything), the labels it elides, and the gathering definitions it
// enforces, per tenant. Immutable; swapped whole on reload.
type Policy struct {
	allow  *allowlist.List
	elide  map[string]struct{}
	gather *gatherPolicy // the default definition; nil without one
	// tenantGather holds the definitions of tenants with their own; a
	// tenant not in it is held to gather.
	tenantGather map[string]*gatherPolicy
}

// gatherPolicy is one gathering definition's share of the policy.
type gatherPolicy = gathering.Allowlists

// WithGathering returns a copy of p that enforces gathering definitions:
// a series of a tenant is kept if the config's allowlist (when set) or the
// tenant's definition in force selects it, or one of the versions that
// definition replaced, each until its Until (its grace period). The
// tenant's definition is its own in tenants, else def; with neither (def
// nil), only the config's allowlist applies to it. An entry without Cur
// (a definition whose file was removed: the default, or a tenant's own
// without a default) is the config's allowlist and its Prev — or
// everything, without an allowlist, as for a tenant without a definition. The forwarders' own gathering.InfoMetric
// series is always kept where a definition applies. tenants must not be
// modified afterwards.
func (p *Policy) WithGathering(def *gathering.Allowlists, tenants map[string]gathering.Allowlists) *Policy {
	q := *p
	q.gather = def
	q.tenantGather = make(map[string]*gatherPolicy, len(tenants))
	for t, a := range tenants {
		q.tenantGather[t] = &a
	}
	return &q
}

// gatherFor returns the gathering definition enforced for tenant (nil if
// none).
func (p *Policy) gatherFor(tenant string) *gatherPolicy {
	if g, ok := p.tenantGather[tenant]; ok {
		return g
	}
	return p.gather
}

// GatheringSource is the gathering definitions' selectors, the default's
// (nil without one) and per tenant; *gathering.Server implements it.
type GatheringSource interface {
	Allowlists() (def *gathering.Allowlists, tenants map[string]gathering.Allowlists)
}

// PolicyUpdater installs into a Handler the config's policy combined with
// the gathering definitions, whenever either changes. Safe for concurrent use.
type PolicyUpdater struct {
	mu   sync.Mutex
	h    *Handler
	base *Policy
	g    GatheringSource // nil: no gathering definition
}

// NewPolicyUpdater installs base (combined with g, which may be nil) into h.
func NewPolicyUpdater(h *Handler, base *Policy, g GatheringSource) *PolicyUpdater {
	u := &PolicyUpdater{h: h, base: base, g: g}
	u.SetBase(base)
	return u
}

// SetBase replaces the config's policy (config reload).
func (u *PolicyUpdater) SetBase(p *Policy) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.base = p
	u.install()
}

// GatheringChanged recomputes the policy after a definition changed.
func (u *PolicyUpdater) GatheringChanged() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.install()
}

func (u *PolicyUpdater) install() {
	if u.g == nil {
		u.h.SetPolicy(u.base)
		return
	}
	u.h.SetPolicy(u.base.WithGathering(u.g.Allowlists()))
}

// NewPolicy compiles the policy of cfg. LoadConfig has validated it.
func NewPolicy(cfg *Config) (*Policy, error) {
	p := &Policy{elide: map[string]struct{}{}}
	if len(cfg.Allowlist) > 0 {
		l, err := allowlist.Parse(cfg.Allowlist)
		if err != nil {
			return nil, err
		}
		p.allow = l
	}
	for _, n := range cfg.ElideLabels {
		p.elide[n] = struct{}{}
	}
	return p, nil
}

// elide removes the elided labels from ls in place.
func (p *Policy) elideLabels(ls []prompb.Label) []prompb.Label {
	if len(p.elide) == 0 {
		return ls
	}
	out := ls[:0]
	for _, l := range ls {
		if _, drop := p.elide[l.Name]; !drop {
			out = append(out, l)
		}
	}
	return out
}

// allows reports whether the policy admits ls, a series of tenant.
func (p *Policy) allows(tenant string, ls []prompb.Label) bool {
	g := p.gatherFor(tenant)
	if p.allow == nil && (g == nil || g.Cur == nil) {
		return true // nothing selects: a tenant without a definition in force
	}
	get := func(name string) string { return labelValue(ls, name) }
	if g == nil {
		return p.allow.AllowsFunc(get)
	}
	switch {
	case get(model.MetricNameLabel) == gathering.InfoMetric,
		p.allow != nil && p.allow.AllowsFunc(get),
		g.Cur.AllowsFunc(get): // a nil Cur allows nothing
		return true
	}
	for _, prev := range g.Prev {
		if prev.Allow.AllowsFunc(get) && time.Now().Before(prev.Until) {
			return true
		}
	}
	return false
}

// labelValue returns the value of the label name in ls, or "". An empty
// value means the label is absent, so one is passed over: ls may be a 1.0
// series read before validateSeries dropped them (the deny list's check, a
// refusal's example), whose empty _id must not hide the _id it is stored
// under.
func labelValue(ls []prompb.Label, name string) string {
	for _, l := range ls {
		if l.Name == name && l.Value != "" {
			return l.Value
		}
	}
	return ""
}

// seriesSeed seeds the limiter's series hashes (in memory only).
var seriesSeed = maphash.MakeSeed()

// hashLabels identifies a series for the limiter without building
// labels.Labels. ls must be sorted; every label counts, _id included.
func hashLabels(ls []prompb.Label) uint64 { return labelhash.Seeded(seriesSeed, ls) }

// seriesKey is the limiter's key of a series: 128 bits, the seeded half
// hashLabels. It also keys the series' head reference (hintedWriter), so
// it must be collision-free in practice, as 128 bits are (~n²/2¹²⁹).
func seriesKey(ls []prompb.Label) limits.Key {
	return limits.Key{labelhash.Unseeded(ls), hashLabels(ls)}
}
