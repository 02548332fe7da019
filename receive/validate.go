package receive

import (
	"fmt"
	"unicode/utf8"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

// Reasons a series or its samples are rejected; the label values of
// phonehome_receive_rejected_samples_total.
const (
	reasonInvalidLabels   = "invalid_labels"
	reasonInvalidSeries   = "invalid_series" // 2.0: bad symbol refs, samples and histograms
	reasonLabelLimits     = "label_limits"
	reasonClusterMismatch = "cluster_mismatch"
	reasonNoSamples       = "no_samples"
	reasonOutOfOrder      = "out_of_order"
	reasonTooOld          = "too_old"
	reasonFuture          = "too_far_in_future"
	reasonDuplicate       = "duplicate_timestamp"
	reasonStorage         = "storage"
	reasonAllowlist       = "allowlist"
	reasonSeriesLimit     = "series_limit"
	reasonRateLimit       = "rate_limit"
	reasonInvalidMetadata = "invalid_metadata"
)

var allReasons = []string{
	reasonInvalidLabels, reasonInvalidSeries, reasonLabelLimits, reasonClusterMismatch, reasonNoSamples,
	reasonOutOfOrder, reasonTooOld, reasonFuture, reasonDuplicate, reasonStorage,
	reasonAllowlist, reasonSeriesLimit, reasonRateLimit, reasonInvalidMetadata,
}

// clusterLabel is the label that carries a cluster's pseudonymous id.
const clusterLabel = "_id"

// seriesError explains why one series was refused.
type seriesError struct {
	reason string
	msg    string
}

func (e *seriesError) Error() string { return e.msg }

// validateSeries checks one series in place. Labels with empty values are
// removed (an empty value means "absent" in Prometheus' data model). When
// id binds a cluster, the series' _id must equal it (or is overwritten with
// it when overwriteID is set, or when it is the cluster's own id in clear,
// id.ClusterIDAlias), and is added if missing.
// It returns nil if the series may be stored.
func validateSeries(ts *prompb.TimeSeries, lim *limits.TenantLimits, id auth.Identity, overwriteID bool) (name string, serr *seriesError) {
	clusterID := id.ClusterID
	if len(ts.Samples) == 0 && len(ts.Histograms) == 0 {
		return "", &seriesError{reasonNoSamples, "series has no samples"}
	}
	ls := ts.Labels[:0]
	for _, l := range ts.Labels {
		if l.Value != "" {
			ls = append(ls, l)
		}
	}
	ts.Labels = ls
	count := len(ls)
	if clusterID != "" && clusterOf(ls) == "" {
		count++ // the _id added below counts too
	}
	if over(count, lim.MaxLabelNamesPerSeries) {
		return "", &seriesError{reasonLabelLimits, fmt.Sprintf("series has %d labels, the limit is %d", count, lim.MaxLabelNamesPerSeries)}
	}
	hasID := false
	for i, l := range ls {
		if l.Name == "" {
			return "", &seriesError{reasonInvalidLabels, "empty label name"}
		}
		if i > 0 && ls[i-1].Name >= l.Name {
			if ls[i-1].Name == l.Name {
				return "", &seriesError{reasonInvalidLabels, fmt.Sprintf("duplicate label name %q", l.Name)}
			}
			return "", &seriesError{reasonInvalidLabels, fmt.Sprintf("labels not sorted: %q after %q", l.Name, ls[i-1].Name)}
		}
		if over(len(l.Name), lim.MaxLabelNameLength) {
			return "", &seriesError{reasonLabelLimits, fmt.Sprintf("label name of %d bytes, the limit is %d", len(l.Name), lim.MaxLabelNameLength)}
		}
		if over(len(l.Value), lim.MaxLabelValueLength) {
			return "", &seriesError{reasonLabelLimits, fmt.Sprintf("value of label %q has %d bytes, the limit is %d", l.Name, len(l.Value), lim.MaxLabelValueLength)}
		}
		if !model.LegacyValidation.IsValidLabelName(l.Name) {
			return "", &seriesError{reasonInvalidLabels, fmt.Sprintf("invalid label name %q", l.Name)}
		}
		if !utf8.ValidString(l.Value) {
			return "", &seriesError{reasonInvalidLabels, fmt.Sprintf("value of label %q is not valid UTF-8", l.Name)}
		}
		switch l.Name {
		case model.MetricNameLabel:
			name = l.Value
		case clusterLabel:
			hasID = true
			if clusterID != "" && l.Value != clusterID {
				if !overwriteID && (id.ClusterIDAlias == "" || l.Value != id.ClusterIDAlias) {
					return "", &seriesError{reasonClusterMismatch, "series _id does not match the authenticated cluster"}
				}
				ls[i].Value = clusterID
			}
		}
	}
	if name == "" {
		return "", &seriesError{reasonInvalidLabels, "series has no metric name (__name__)"}
	}
	if !model.LegacyValidation.IsValidMetricName(name) {
		return "", &seriesError{reasonInvalidLabels, fmt.Sprintf("invalid metric name %q", name)}
	}
	if clusterID != "" && !hasID {
		ts.Labels = insertLabel(ts.Labels, prompb.Label{Name: clusterLabel, Value: clusterID})
	}
	return name, nil
}

// over reports whether n exceeds limit, where a limit of 0 means unlimited.
func over(n, limit int) bool { return limit > 0 && n > limit }

// clusterOf returns the series' _id, or "".
func clusterOf(ls []prompb.Label) string { return labelValue(ls, clusterLabel) }

// insertLabel adds l to the sorted ls, keeping it sorted.
func insertLabel(ls []prompb.Label, l prompb.Label) []prompb.Label {
	i := 0
	for i < len(ls) && ls[i].Name < l.Name {
		i++
	}
	ls = append(ls, prompb.Label{})
	copy(ls[i+1:], ls[i:])
	ls[i] = l
	return ls
}
