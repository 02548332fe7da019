package receive

import (
	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/allowlist"
)

// Policy is what the server keeps of each series: its allowlist (nil allows
// everything) and the labels it elides. Immutable; swapped whole on reload.
type Policy struct {
	allow *allowlist.List
	elide map[string]struct{}
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
	if p.allow == nil {
		return true
	}
	b.Reset()
	for _, l := range ls {
		b.Add(l.Name, l.Value)
	}
	return p.allow.Allows(b.Labels())
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
