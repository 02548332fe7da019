package receive

import (
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/allowlist"
	"github.com/phonehome/phonehome/gathering"
)

// Policy is what the server keeps of each series: its allowlist (nil allows
// everything) and the labels it elides. Immutable; swapped whole on reload.
type Policy struct {
	allow  *allowlist.List
	elide  map[string]struct{}
	gather *gatherPolicy // nil without a gathering definition
}

// gatherPolicy is the served gathering definition's share of the policy.
type gatherPolicy struct {
	cur, prev *allowlist.List // prev may be nil
	prevUntil time.Time
}

// WithGathering returns a copy of p that enforces a gathering definition: a
// series is kept if the config's allowlist (when set) or the definition in
// force (cur) selects it, or — until prevUntil, the grace period — the
// previous definition (prev, may be nil). The forwarders' own
// gathering.InfoMetric series is always kept.
func (p *Policy) WithGathering(cur, prev *allowlist.List, prevUntil time.Time) *Policy {
	q := *p
	q.gather = &gatherPolicy{cur: cur, prev: prev, prevUntil: prevUntil}
	return &q
}

// GatheringSource is the gathering definition's selectors; *gathering.Server
// implements it.
type GatheringSource interface {
	Allowlists() (cur, prev *allowlist.List, prevUntil time.Time)
}

// PolicyUpdater installs into a Handler the config's policy combined with
// the gathering definition, whenever either changes. Safe for concurrent use.
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

// GatheringChanged recomputes the policy after the definition changed.
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

// allows reports whether the allowlist admits ls; b is scratch space.
func (p *Policy) allows(ls []prompb.Label, b *labels.ScratchBuilder) bool {
	if p.allow == nil && p.gather == nil {
		return true
	}
	b.Reset()
	for _, l := range ls {
		b.Add(l.Name, l.Value)
	}
	lbls := b.Labels()
	if p.gather == nil {
		return p.allow.Allows(lbls)
	}
	g := p.gather
	switch {
	case lbls.Get(model.MetricNameLabel) == gathering.InfoMetric,
		p.allow != nil && p.allow.Allows(lbls),
		g.cur.Allows(lbls):
		return true
	}
	return g.prev != nil && g.prev.Allows(lbls) && time.Now().Before(g.prevUntil)
}

var sep = []byte{0xff}

// hashLabels identifies a series for the limiter without building
// labels.Labels. ls must be sorted; every label counts, _id included.
func hashLabels(ls []prompb.Label) uint64 {
	d := xxhash.New()
	for _, l := range ls {
		_, _ = d.WriteString(l.Name)
		_, _ = d.Write(sep)
		_, _ = d.WriteString(l.Value)
		_, _ = d.Write(sep)
	}
	return d.Sum64()
}
