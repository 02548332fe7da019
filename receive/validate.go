package receive

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/relabel"
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
	reasonErased          = "erased" // the cluster was erased and is denied until re-admitted
)

var allReasons = []string{
	reasonInvalidLabels, reasonInvalidSeries, reasonLabelLimits, reasonClusterMismatch, reasonNoSamples,
	reasonOutOfOrder, reasonTooOld, reasonFuture, reasonDuplicate, reasonStorage,
	reasonAllowlist, reasonSeriesLimit, reasonRateLimit, reasonInvalidMetadata, reasonErased,
}

// clusterLabel is the label that carries a cluster's pseudonymous id.
const clusterLabel = relabel.IDLabel

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
// id.ClusterIDAlias), and is added if missing; an _id among its exemplars'
// labels is held to the same rule (bindExemplars). The raw id (4 bytes or
// more) is also replaced inside every other label value of the series and
// its exemplars (replaceRawID).
// Labels out of order by name, as any client that builds them from a map
// sends them, are sorted in place, as Prometheus does (resorted reports it);
// only what cannot be repaired (a duplicate or empty name) is refused. A
// series already in order, the common case, costs no extra pass: the order is
// checked in the same loop as everything else, which starts again once after
// a sort.
// It returns nil if the series may be stored.
func validateSeries(ts *prompb.TimeSeries, lim *limits.TenantLimits, id auth.Identity, overwriteID bool) (name string, resorted bool, serr *seriesError) {
	clusterID := id.ClusterID
	if id.ClusterIDAlias != "" {
		// First of all: a refused series' labels are kept as an example
		// (the status page), and the raw id must not be among them.
		replaceRawID(ts.Labels, id.ClusterIDAlias, clusterID)
		for i := range ts.Exemplars {
			replaceRawID(ts.Exemplars[i].Labels, id.ClusterIDAlias, clusterID)
		}
	}
	if len(ts.Samples) == 0 && len(ts.Histograms) == 0 {
		return "", resorted, &seriesError{reasonNoSamples, "series has no samples"}
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
		return "", resorted, &seriesError{reasonLabelLimits, fmt.Sprintf("series has %d labels, the limit is %d", count, lim.MaxLabelNamesPerSeries)}
	}
	hasID := false
	for i := 0; i < len(ls); i++ {
		l := ls[i]
		if l.Name == "" {
			return "", resorted, &seriesError{reasonInvalidLabels, "empty label name"}
		}
		if i > 0 && ls[i-1].Name >= l.Name {
			if ls[i-1].Name == l.Name {
				return "", resorted, &seriesError{reasonInvalidLabels, fmt.Sprintf("duplicate label name %q", l.Name)}
			}
			// Out of order: sort and check again from the start. After a
			// sort only a duplicate name can land here, so this happens once.
			slices.SortFunc(ls, compareLabelNames)
			resorted, name, hasID, i = true, "", false, -1
			continue
		}
		if over(len(l.Name), lim.MaxLabelNameLength) {
			return "", resorted, &seriesError{reasonLabelLimits, fmt.Sprintf("label name of %d bytes, the limit is %d", len(l.Name), lim.MaxLabelNameLength)}
		}
		if over(len(l.Value), lim.MaxLabelValueLength) {
			return "", resorted, &seriesError{reasonLabelLimits, fmt.Sprintf("value of label %q has %d bytes, the limit is %d", l.Name, len(l.Value), lim.MaxLabelValueLength)}
		}
		if !model.LegacyValidation.IsValidLabelName(l.Name) {
			return "", resorted, &seriesError{reasonInvalidLabels, fmt.Sprintf("invalid label name %q", l.Name)}
		}
		if !utf8.ValidString(l.Value) {
			return "", resorted, &seriesError{reasonInvalidLabels, fmt.Sprintf("value of label %q is not valid UTF-8", l.Name)}
		}
		switch l.Name {
		case model.MetricNameLabel:
			name = l.Value
		case clusterLabel:
			hasID = true
			if clusterID != "" && l.Value != clusterID {
				if !overwriteID {
					return "", resorted, &seriesError{reasonClusterMismatch, "series _id does not match the authenticated cluster"}
				}
				ls[i].Value = clusterID
			}
		}
	}
	if name == "" {
		return "", resorted, &seriesError{reasonInvalidLabels, "series has no metric name (__name__)"}
	}
	if !model.LegacyValidation.IsValidMetricName(name) {
		return "", resorted, &seriesError{reasonInvalidLabels, fmt.Sprintf("invalid metric name %q", name)}
	}
	if clusterID != "" && len(ts.Exemplars) > 0 {
		if serr := bindExemplars(ts.Exemplars, id, overwriteID); serr != nil {
			return "", resorted, serr
		}
	}
	if clusterID != "" && !hasID {
		ts.Labels = insertLabel(ts.Labels, prompb.Label{Name: clusterLabel, Value: clusterID})
	}
	return name, resorted, nil
}

// bindExemplars holds an _id among exemplar labels to its series' rule: an
// exemplar is data of the series it is attached to, whose _id is id's
// cluster, so it may carry that _id or none. Another is rewritten when
// overwriteID is set, and refuses the series otherwise (the raw id,
// id.ClusterIDAlias, was rewritten already: replaceRawID). Without it a
// cluster could store, and pass upstream, another cluster's _id, or its own
// raw id, in its exemplars.
func bindExemplars(exemplars []prompb.Exemplar, id auth.Identity, overwriteID bool) *seriesError {
	for i := range exemplars {
		ls := exemplars[i].Labels
		for j := range ls {
			switch v := ls[j].Value; {
			case ls[j].Name != clusterLabel, v == "", v == id.ClusterID:
			case overwriteID:
				ls[j].Value = id.ClusterID
			default:
				return &seriesError{reasonClusterMismatch, "exemplar _id does not match the authenticated cluster"}
			}
		}
	}
	return nil
}

// replaceRawID replaces the raw cluster id in ls with its pseudonym: an _id
// equal to it, and, as the forwarder does (defence in depth), the raw id
// inside any label value (a console URL, a label of the cluster's own
// naming), so that it reaches neither the WAL nor the status page. A raw id
// shorter than the forwarder's relabel.MinScrubLen (a test cluster's "c1")
// is too common a string to be told from other text, and is replaced only
// where it is the whole _id.
func replaceRawID(ls []prompb.Label, raw, pseudonym string) {
	for i := range ls {
		switch v := ls[i].Value; {
		case v == raw && ls[i].Name == clusterLabel:
			ls[i].Value = pseudonym
		case len(raw) >= relabel.MinScrubLen && strings.Contains(v, raw):
			ls[i].Value = strings.ReplaceAll(v, raw, pseudonym)
		}
	}
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
