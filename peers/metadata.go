package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/phonehome/phonehome/query"
)

// MetadataPath is where a receiver serves metric metadata: the fleet's to
// any reader, its own to a peer (ScopeHeader "local"). See MetadataHandler.
const MetadataPath = "/api/v1/metadata"

// maxMetadataAnswer bounds a peer's metadata answer (as ChunkedReadLimit
// bounds a remote-read frame); a larger one is a failed peer.
const maxMetadataAnswer = 50 << 20

// MetadataHandler serves GET MetadataPath (auth.Middleware with
// auth.PermRead in front, authenticating with Authenticator): a request with
// ScopeHeader "local" — a peer's — gets local, this receiver's own
// metadata, so that peers never recurse; any other is fleet's (the query
// API, whose metadata is Metadata's). Every answer carries InstanceHeader.
func (s *Set) MetadataHandler(fleet http.Handler, local query.MetadataReader, ready func() bool) http.Handler {
	localH := query.NewMetadataHandler(local, ready)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, s.instance)
		if r.Header.Get(ScopeHeader) == ScopeLocal {
			localH.ServeHTTP(w, r)
			return
		}
		fleet.ServeHTTP(w, r)
	})
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
	ctx = context.WithValue(ctx, tenantKey{}, tenant)
	ctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.Timeout))
	defer cancel()
	md, err := s.getMetadata(ctx, p, q)
	if err != nil {
		s.m.reads.WithLabelValues("error").Inc()
		s.logger.Debug("peer metadata read failed", "peer", p.addr, "err", err)
		return nil, fmt.Errorf("peer %s unavailable, its metadata is missing: %w", p.addr, err)
	}
	s.m.reads.WithLabelValues("success").Inc()
	return md, nil
}

func (s *Set) getMetadata(ctx context.Context, p *peer, q query.MetadataQuery) (map[string][]metadata.Metadata, error) {
	u := s.cfg.Scheme + "://" + p.addr + MetadataPath + "?" + q.Values().Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.query.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetadataAnswer+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxMetadataAnswer {
		return nil, fmt.Errorf("answer exceeds %d bytes", maxMetadataAnswer)
	}
	var out struct {
		Status string                         `json:"status"`
		Data   map[string][]metadata.Metadata `json:"data"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("decode answer: %w", err)
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("answer status %q", out.Status)
	}
	return out.Data, nil
}
