package query

import (
	"context"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/scrape"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/phonehome/phonehome/auth"
)

// MetadataReader returns a tenant's metric metadata by metric family (all
// of them when metric is "", at most limit families when limit >= 0).
// *storage.DB implements it.
type MetadataReader interface {
	Metadata(tenant, metric string, limit int) (map[string][]metadata.Metadata, error)
}

// metadataTargets serves /api/v1/metadata from stored metadata through
// Prometheus' own handler, which reads metadata from active scrape targets:
// it presents the tenant's metadata as pseudo-targets, the j-th carrying the
// j-th distinct metadata of every metric family. Prometheus' handler then
// applies limit, limit_per_metric and metric and writes its exact JSON.
// The receiver does not serve /targets, so the pseudo-targets show nowhere
// else.
func metadataTargets(mr MetadataReader) func(context.Context) v1.TargetRetriever {
	return func(ctx context.Context) v1.TargetRetriever {
		id, ok := auth.FromContext(ctx)
		if !ok || id.Tenant == "" {
			return noTargets{}
		}
		byFamily, err := mr.Metadata(id.Tenant, "", -1)
		if err != nil {
			return noTargets{} // not ready: the API's ready wrapper answers 503
		}
		var stores []metadataStore
		for fam, ms := range byFamily {
			for j, m := range ms {
				if j == len(stores) {
					stores = append(stores, metadataStore{})
				}
				stores[j][fam] = scrape.MetricMetadata{MetricFamily: fam, Type: m.Type, Help: m.Help, Unit: m.Unit}
			}
		}
		targets := make([]*scrape.Target, len(stores))
		for j, s := range stores {
			targets[j] = scrape.NewTarget(labels.EmptyLabels(), nil, nil, nil)
			targets[j].SetMetadataStore(s)
		}
		return storedMetadata{targets: targets}
	}
}

// storedMetadata is a TargetRetriever whose only active targets are the
// metadata pseudo-targets.
type storedMetadata struct {
	noTargets
	targets []*scrape.Target
}

func (s storedMetadata) TargetsActive() map[string][]*scrape.Target {
	return map[string][]*scrape.Target{"remote_write": s.targets}
}

// metadataStore is one pseudo-target's metadata, by family.
type metadataStore map[string]scrape.MetricMetadata

func (s metadataStore) ListMetadata() []scrape.MetricMetadata {
	out := make([]scrape.MetricMetadata, 0, len(s))
	for _, m := range s {
		out = append(out, m)
	}
	return out
}

func (s metadataStore) GetMetadata(family string) (scrape.MetricMetadata, bool) {
	m, ok := s[family]
	return m, ok
}

func (s metadataStore) SizeMetadata() int {
	n := 0
	for _, m := range s {
		n += len(m.MetricFamily) + len(m.Help) + len(m.Unit) + len(m.Type)
	}
	return n
}

func (s metadataStore) LengthMetadata() int { return len(s) }
