package limits

import (
	"errors"
	"strconv"
)

// Limit names: the YAML key of the limit that refused something. They are the
// values of LimitError.Limit and of the `limit` label of
// phonehome_limits_rejected_total. The label and size limits of the same
// configuration are applied by the receiver as it decodes (package receive)
// and counted there: phonehome_receive_rejected_samples_total{reason=
// "label_limits"}, and 413 answers.
const (
	LimitSeriesPerCluster        = "max_series_per_cluster"
	LimitSeriesPerTenant         = "max_series_per_tenant"
	LimitSeriesPerMetric         = "max_series_per_metric"
	LimitSamplesPerSecondCluster = "samples_per_second_per_cluster"
	LimitSamplesPerSecondTenant  = "samples_per_second_per_tenant"
	LimitBurstPerCluster         = "burst_per_cluster"
	LimitBurstPerTenant          = "burst_per_tenant"
	// LimitInflightRequestsPerCluster refuses a request (429) while its
	// cluster has that many write requests in flight.
	LimitInflightRequestsPerCluster = "max_inflight_requests_per_cluster"
)

// limitNames is the fixed label set of the rejected counter.
func limitNames() []string {
	return []string{
		LimitSeriesPerCluster, LimitSeriesPerTenant, LimitSeriesPerMetric,
		LimitSamplesPerSecondCluster, LimitSamplesPerSecondTenant,
		LimitBurstPerCluster, LimitBurstPerTenant,
		LimitInflightRequestsPerCluster,
	}
}

// Classes of refusal. Every *LimitError wraps exactly one, so the receiver
// maps them to a status with errors.Is:
//
//	ErrSeriesLimit → drop the series, keep the rest of the request (partial write)
//	ErrRateLimited → 429 with Retry-After
//	ErrTooLarge    → 413
var (
	ErrSeriesLimit = errors.New("series limit reached")
	ErrRateLimited = errors.New("rate limited")
	ErrTooLarge    = errors.New("request too large")
)

// LimitError says which limit refused something and its value, for the
// response body. It wraps one of the Err* classes above.
type LimitError struct {
	Limit string  // one of the Limit* names
	Value float64 // the configured value of that limit
}

func (e *LimitError) Error() string {
	return e.Limit + " limit of " + strconv.FormatFloat(e.Value, 'f', -1, 64) + " reached"
}

// Unwrap returns the class of the refusal.
func (e *LimitError) Unwrap() error {
	switch e.Limit {
	case LimitSeriesPerCluster, LimitSeriesPerTenant, LimitSeriesPerMetric:
		return ErrSeriesLimit
	case LimitSamplesPerSecondCluster, LimitSamplesPerSecondTenant, LimitInflightRequestsPerCluster:
		return ErrRateLimited
	case LimitBurstPerCluster, LimitBurstPerTenant:
		return ErrTooLarge
	}
	return nil
}
