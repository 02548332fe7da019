package peers

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/phonehome/phonehome/query"
)

// MetadataPath is where a receiver serves metric metadata: the fleet's to
// any reader, its own to a peer (ScopeHeader "local"). See MetadataHandler.
const MetadataPath = "/api/v1/metadata"

// MetadataHandler serves GET MetadataPath (auth.Middleware with
// auth.PermRead in front, authenticating with Authenticator): a request with
// ScopeHeader "local" — a peer's — gets local, this receiver's own
// metadata, so that peers never recurse; any other is fleet's (the query
// API, whose metadata is Metadata's). Every answer carries InstanceHeader.
func (s *Set) MetadataHandler(fleet http.Handler, local query.MetadataReader, ready func() bool) http.Handler {
	return s.scoped(query.NewMetadataHandler(local, ready), fleet)
}

// Metadata returns the fleet's metadata: local's (this receiver's own;
// its errors fail the request) merged with every peer's own, asked with
// the same query in parallel (query.MergeMetadata). A peer that fails is a
// warning and its metadata is missing.
func (s *Set) Metadata(local query.MetadataReader) query.MetadataReader {
	return fleetMetadata{set: s, local: local}
}

type fleetMetadata struct {
	set   *Set
	local query.MetadataReader
}

func (f fleetMetadata) Metadata(ctx context.Context, tenant string, q query.MetadataQuery) (map[string][]metadata.Metadata, annotations.Annotations, error) {
	ps := f.set.snapshot()
	answers := make([]map[string][]metadata.Metadata, len(ps)+1)
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { answers[i+1], errs[i] = f.set.peerMetadata(ctx, p, tenant, q) })
	}
	own, ws, err := f.local.Metadata(ctx, tenant, q)
	wg.Wait()
	if err != nil {
		return nil, nil, err
	}
	answers[0] = own
	for _, err := range errs {
		if err != nil {
			ws.Add(err)
		}
	}
	return query.MergeMetadata(q, answers...), ws, nil
}

// peerMetadata asks p for its own metadata of tenant, through the peer
// transport (credential, local scope), within the peer timeout.
func (s *Set) peerMetadata(ctx context.Context, p *peer, tenant string, q query.MetadataQuery) (map[string][]metadata.Metadata, error) {
	callCtx, cancel := context.WithTimeout(context.WithValue(ctx, tenantKey{}, tenant), time.Duration(s.cfg.Timeout))
	defer cancel()
	md, err := s.getMetadata(callCtx, p, q)
	if err != nil && ctx.Err() != nil { // the caller went away: not p's failure (indexCallDone)
		return nil, fmt.Errorf("peer %s: %w", p.addr, err)
	}
	if err != nil {
		s.m.reads.WithLabelValues("error").Inc()
		s.logger.Debug("peer metadata read failed", "peer", p.addr, "err", err)
		return nil, fmt.Errorf("peer %s unavailable, its metadata is missing: %w", p.addr, err)
	}
	s.m.reads.WithLabelValues("success").Inc()
	return md, nil
}

func (s *Set) getMetadata(ctx context.Context, p *peer, q query.MetadataQuery) (map[string][]metadata.Metadata, error) {
	md, _, err := getAPI[map[string][]metadata.Metadata](ctx, s, p, MetadataPath, q.Values())
	return md, err
}
