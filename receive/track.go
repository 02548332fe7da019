package receive

import (
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/gathering"
	"github.com/phonehome/phonehome/limits"
)

// The hooks that feed the limiter's per-cluster tracking (the status page):
// admitted samples and the gathering-definition version per cluster,
// refusals by reason with an example, and each request's protocol and
// client. Without limits.Limiter.TrackClusters they cost an integer add
// per series and a nil check per request.

// Reasons are the refusal reasons of phonehome_receive_rejected_samples_total,
// for limits.Limiter.TrackClusters.
func Reasons() []string { return append([]string(nil), allReasons...) }

// tracked records an admitted series in its cluster's Session.
func tracked(s *limits.Session, name string, ts *prompb.TimeSeries) {
	s.Accept(len(ts.Samples) + len(ts.Histograms))
	if name == gathering.InfoMetric {
		s.Definition(labelValue(ts.Labels, "version"))
	}
}

// refuse records a refused series against the cluster that sent it: the
// credential's, or the series' own _id for a credential bound to none. In
// that case only a cluster already known (tracked, or admitted earlier in
// this request) gets it; other refusals count for the tenant alone, so
// refused series of made-up ids cannot grow the table of clusters.
func (ss *sessions) refuse(l *limits.Limiter, id auth.Identity, ts *prompb.TimeSeries, reason string, samples int) {
	if !l.Tracking() {
		return
	}
	cluster := id.ClusterID
	if cluster == "" {
		cluster = clusterOf(ts.Labels)
		if _, known := l.Cluster(id.Tenant, cluster); !known && !slices.Contains(ss.clusters, cluster) {
			cluster = ""
		}
	}
	ss.get(l, id.Tenant, cluster).Refuse(reason, samples, func() string { return formatExample(ts.Labels, id.ClusterID) })
}

// redactedID stands in the status page's example for an _id that is not the
// credential's cluster: it may be a raw cluster id (a UUID), which the
// receiver keeps nowhere, or another cluster's.
const redactedID = "<another cluster's _id, not shown>"

// formatExample is formatLabels for a refusal's example, with an _id other
// than cluster's (when the credential has one) redacted.
func formatExample(ls []prompb.Label, cluster string) string {
	if v := clusterOf(ls); cluster == "" || v == "" || v == cluster {
		return formatLabels(ls)
	}
	out := slices.Clone(ls)
	for i := range out {
		if out[i].Name == clusterLabel {
			out[i].Value = redactedID
		}
	}
	return formatLabels(out)
}

// done publishes every Session of the request, with its protocol and client.
func (ss *sessions) done(proto, userAgent string) {
	for _, s := range ss.s {
		s.Done(proto, userAgent)
	}
}

// formatLabels renders ls as PromQL would a series: {name="value", ...}.
func formatLabels(ls []prompb.Label) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, l := range ls {
		if i > 0 {
			b.WriteString(", ")
		}
		if l.Name == model.MetricNameLabel || model.LegacyValidation.IsValidLabelName(l.Name) {
			b.WriteString(l.Name)
		} else {
			b.WriteString(strconv.Quote(l.Name))
		}
		b.WriteByte('=')
		b.WriteString(strconv.Quote(l.Value))
	}
	b.WriteByte('}')
	return b.String()
}
