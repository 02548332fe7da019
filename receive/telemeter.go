package receive

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/forward"
	"github.com/phonehome/phonehome/storage"
)

// What Telemeter's two paths do differently from /api/v1/write, so that
// clusters that talked to telemeter-server see no change:
//
//   - Series outside the server-side allowlist are dropped and counted, and
//     the request succeeds: telemeter-server filtered uploads silently, and
//     a 400 makes telemeter-client retry every minute (and fire the
//     cluster's TelemeterClientFailures) or Prometheus drop its batch (and
//     fire PrometheusRemoteStorageFailures) for an allowlist that merely
//     differs from the cluster's.
//   - The replica label (prometheus_replica) is removed: federation and
//     remote-write both carry the Prometheus replica's external labels, and
//     a cluster runs two replicas. Uploads come from whichever replica the
//     federation request reached; on remote-write both replicas send, and
//     only the one elected per cluster is written (replicaTracker).
//   - A refusal for a rate or in-flight limit is 503 with Retry-After on
//     /metrics/v1/receive, not 429 (telemeterRetryable).
//   - Uploads are stored at the time they are received, as telemeter-server
//     stores them, so a cluster whose clock is off still reports "now"
//     (unless the sender asks to keep its timestamps, keepUploadTimestamps).

// route is the endpoint a write came through.
type route int

const (
	routeRemoteWrite    route = iota // POST /api/v1/write
	routeUpload                      // POST /upload (telemeter-client)
	routeTelemeterWrite              // POST /metrics/v1/receive (Prometheus' telemetry remote-write)
)

func (r route) telemeter() bool { return r != routeRemoteWrite }

// telemeterRetryable: Prometheus drops a remote-write batch answered 429
// unless its remote_write sets retry_on_http_429, which
// cluster-monitoring-operator's telemetry remote_write does not; a 5xx it
// retries, after Retry-After. So on /metrics/v1/receive a limit that only
// asks the cluster to wait is answered 503, or the batch would be lost.
// (telemeter-client re-reads /federate after any failure: /upload keeps 429.)
const telemeterRetryable = http.StatusServiceUnavailable

// keepUploadTimestamps: forward.HeaderTimestamps on an upload with the
// value forward.TimestampsSource keeps the samples' own timestamps. The
// forwarder sends it: its timestamps are exact, and a backlog it delivers
// after an outage must not collapse onto the time of delivery.
func keepUploadTimestamps(r *http.Request) bool {
	return r.Header.Get(forward.HeaderTimestamps) == forward.TimestampsSource
}

// Defaults of TelemeterOptions.
const (
	DefaultReplicaLabel    = "prometheus_replica"
	DefaultReplicaFailover = 2 * time.Minute
)

// TelemeterOptions configures Telemeter's paths.
type TelemeterOptions struct {
	// ReplicaLabel is removed from every series on both paths; on
	// remote-write one replica per cluster is written. "" turns both off.
	ReplicaLabel string
	// ReplicaFailover is how long the elected replica may stay silent
	// before another one takes over. Prometheus sends a telemetry batch at
	// least every batch_send_deadline (1m as cluster-monitoring-operator
	// configures it), so it must be longer than that.
	ReplicaFailover time.Duration
}

// replicaOf returns the replica label's value of the first series that has
// one (an empty value is none): a remote-write request comes from one
// Prometheus.
func replicaOf(series []prompb.TimeSeries, label string) string {
	for i := range series {
		if v := labelValue(series[i].Labels, label); v != "" {
			return v
		}
	}
	return ""
}

// stats counts b's samples and histograms, for the answer to a request that
// is dropped on purpose (the other replica's copy).
func (b *batch) stats() storage.Stats {
	var st storage.Stats
	for i := range b.series {
		st.Samples += len(b.series[i].Samples)
		st.Histograms += len(b.series[i].Histograms)
	}
	return st
}

// dropLabel removes label from every series.
func dropLabel(series []prompb.TimeSeries, label string) {
	for i := range series {
		series[i].Labels = slices.DeleteFunc(series[i].Labels, func(l prompb.Label) bool { return l.Name == label })
	}
}

// replicaTracker elects one Prometheus replica per cluster, as Cortex's HA
// tracker does: the first replica seen is written, the others are answered
// as written and dropped, until the elected one has sent nothing for the
// failover timeout. The load balancer sends a cluster's writes to one
// receiver (docs/scale-out.md), so each receiver's own election is the
// cluster's. After a reshuffle or a restart a receiver elects anew; the
// samples of the two replicas are of the same targets, so a switch costs at
// most the difference of their scrape instants.
type replicaTracker struct {
	failover time.Duration
	mu       sync.Mutex
	elected  map[clusterKey]*electedReplica
	swept    time.Time
}

type clusterKey struct{ tenant, cluster string }

type electedReplica struct {
	replica string
	seen    time.Time
}

func newReplicaTracker(failover time.Duration) *replicaTracker {
	return &replicaTracker{failover: failover, elected: make(map[clusterKey]*electedReplica)}
}

// accept reports whether a request of replica for the cluster is written,
// and whether it made that replica the elected one in place of another.
func (t *replicaTracker) accept(tenant, cluster, replica string, now time.Time) (ok, failedOver bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweep(now)
	e, found := t.elected[clusterKey{tenant, cluster}]
	switch {
	case found && e.replica == replica:
	case found && now.Sub(e.seen) <= t.failover:
		return false, false
	case found:
		failedOver = true
		e.replica = strings.Clone(replica) // the request's strings alias its body
	default:
		e = &electedReplica{replica: strings.Clone(replica)}
		t.elected[clusterKey{strings.Clone(tenant), strings.Clone(cluster)}] = e
	}
	e.seen = now
	return true, failedOver
}

// sweep forgets, once per failover timeout, the clusters whose elected
// replica has been silent longer than that: any replica may take over such
// a cluster anyway.
func (t *replicaTracker) sweep(now time.Time) {
	if now.Sub(t.swept) < t.failover {
		return
	}
	t.swept = now
	for k, e := range t.elected {
		if now.Sub(e.seen) > t.failover {
			delete(t.elected, k)
		}
	}
}
