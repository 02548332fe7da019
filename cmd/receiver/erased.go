package main

import (
	"errors"
	"log/slog"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/status"
	"github.com/phonehome/phonehome/storage"
)

// forgetting is the limiter an erasure makes forget its cluster
// (erasure.Limiter): the status page's saved clusters are written again at
// once, without it, so that the id leaves that file with the erasure, and a
// crash before the next periodic save does not bring back a cluster erased
// without a deny. Also when the limiter did not know the cluster: the file
// may (the offline erasure, whose limiter holds only the file's clusters
// that are not denied).
type forgetting struct {
	*limits.Limiter
	state *status.ClusterState
}

func (f forgetting) Forget(tenant, cluster string) (series int, known bool) {
	series, known = f.Limiter.Forget(tenant, cluster)
	f.state.Forgotten()
	return series, known
}

// openStatusClusters opens the status page's saved clusters of the receiver at
// storagePath into l (status.ClusterState).
func openStatusClusters(logger *slog.Logger, reg prometheus.Registerer, l *limits.Limiter, storagePath string, denied func(tenant, cluster string) bool) *status.ClusterState {
	return status.NewClusterState(logger.With("component", "status"), reg, l, filepath.Join(storagePath, "status", "clusters.json"), denied)
}

// erasedRefusal refuses /authorize to a cluster erased and not re-admitted
// (auth.AuthorizeHandler.Erased), with the text its writes get.
func erasedRefusal(db *storage.DB) func(tenant, cluster string) error {
	return func(tenant, cluster string) error {
		if db.Denied(tenant, cluster) {
			return errors.New(storage.ClusterErasedRefusal)
		}
		return nil
	}
}
