package push

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Error classes; statusFor maps them to HTTP status codes.
var (
	errInvalid     = errors.New("invalid push")
	errTooLarge    = errors.New("push too large")
	errUnsupported = errors.New("unsupported media type")
	errRateLimited = errors.New("rate limited")
	errNotReady    = errors.New("push endpoint not ready")
)

// Rejection reasons, the values of phonehome_push_rejected_total{reason}.
const (
	reasonUnauthenticated = "unauthenticated"
	reasonForbidden       = "forbidden"
	reasonInvalidPath     = "invalid_path"
	reasonUnsupported     = "unsupported_media_type"
	reasonTooLarge        = "too_large"
	reasonParse           = "parse_error"
	reasonUntyped         = "untyped"
	reasonUnsupportedType = "unsupported_type"
	reasonNotAllowed      = "not_allowed"
	reasonInvalidLabel    = "invalid_label"
	reasonLabelConflict   = "label_conflict"
	reasonInvalidValue    = "invalid_value"
	reasonTypeMismatch    = "type_mismatch"
	reasonBucketMismatch  = "bucket_mismatch"
	reasonClusterID       = "cluster_id"
	reasonSeriesLimit     = "series_limit"
	reasonRateLimited     = "rate_limited"
	reasonInternal        = "internal"
	reasonErased          = "erased"
)

var allReasons = []string{
	reasonUnauthenticated, reasonForbidden, reasonInvalidPath, reasonUnsupported, reasonTooLarge,
	reasonParse, reasonUntyped, reasonUnsupportedType, reasonNotAllowed, reasonInvalidLabel,
	reasonLabelConflict, reasonInvalidValue, reasonTypeMismatch, reasonBucketMismatch,
	reasonClusterID, reasonSeriesLimit, reasonRateLimited, reasonInternal, reasonErased,
}

// rejection is a refused push: a reason for the counter, a class for the
// status code and a message for the client.
type rejection struct {
	reason     string
	class      error
	msg        string
	retryAfter time.Duration // for errRateLimited
}

func (r *rejection) Error() string { return r.msg }
func (r *rejection) Unwrap() error { return r.class }

func reject(reason string, class error, format string, args ...any) *rejection {
	return &rejection{reason: reason, class: class, msg: fmt.Sprintf(format, args...)}
}

// statusFor is the single place where push errors become HTTP status codes.
func statusFor(err error) int {
	switch {
	case err == nil:
		return http.StatusOK // what the Pushgateway answers; client_golang accepts 200 and 202
	case errors.Is(err, errInvalid):
		return http.StatusBadRequest
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errUnsupported):
		return http.StatusUnsupportedMediaType
	case errors.Is(err, errRateLimited):
		return http.StatusTooManyRequests
	case errors.Is(err, errNotReady):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// reasonOf names the rejection reason of err.
func reasonOf(err error) string {
	var r *rejection
	if errors.As(err, &r) {
		return r.reason
	}
	return reasonInternal
}
