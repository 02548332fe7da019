package main

import (
	"errors"

	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/status"
	"github.com/phonehome/phonehome/storage"
)

// forgetting is the limiter an erasure makes forget its cluster
// (erasure.Limiter): the status page's saved clusters are written again at
// once, so that a crash before the next periodic save does not bring back
// a cluster erased without a deny.
type forgetting struct {
	*limits.Limiter
	state *status.ClusterState
}

func (f forgetting) Forget(tenant, cluster string) (series int, known bool) {
	series, known = f.Limiter.Forget(tenant, cluster)
	if known {
		f.state.Forgotten()
	}
	return series, known
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
