package bucketstore

import "github.com/prometheus/client_golang/prometheus"

// CacheBlocksGauge exposes the cached blocks gauge to tests.
func (s *Store) CacheBlocksGauge() prometheus.Collector { return s.m.cacheBlocks }
