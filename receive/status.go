package receive

import (
	"errors"
	"net/http"

	promstorage "github.com/prometheus/prometheus/storage"

	"github.com/phonehome/phonehome/limits"
	"github.com/phonehome/phonehome/storage"
)

// statusFor is the single place where errors become HTTP status codes.
func statusFor(err error) int {
	switch {
	case err == nil:
		return http.StatusNoContent
	case errors.Is(err, limits.ErrRateLimited):
		return http.StatusTooManyRequests
	case errors.Is(err, errTooLarge), errors.Is(err, limits.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errOverloadedBytes): // before errBadRequest: whatever wraps it, the client must retry
		return http.StatusServiceUnavailable
	case errors.Is(err, errUnsupported):
		return http.StatusUnsupportedMediaType
	case errors.Is(err, errBadRequest),
		errors.Is(err, storage.ErrInvalidTenant),
		errors.Is(err, storage.ErrInvalidSample),
		errors.Is(err, promstorage.ErrOutOfOrderSample),
		errors.Is(err, promstorage.ErrOutOfBounds),
		errors.Is(err, promstorage.ErrTooOldSample),
		errors.Is(err, promstorage.ErrDuplicateSampleForTimestamp):
		return http.StatusBadRequest // the client must not retry
	case errors.Is(err, storage.ErrNotReady):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// reasonFor names the rejection reason of a storage error.
func reasonFor(err error) string {
	switch {
	case errors.Is(err, promstorage.ErrOutOfOrderSample):
		return reasonOutOfOrder
	case errors.Is(err, promstorage.ErrTooOldSample):
		return reasonTooOld
	case errors.Is(err, promstorage.ErrOutOfBounds):
		return reasonFuture
	case errors.Is(err, promstorage.ErrDuplicateSampleForTimestamp):
		return reasonDuplicate
	default:
		return reasonStorage
	}
}
