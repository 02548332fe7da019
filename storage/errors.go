package storage

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidTenant is returned for a tenant name that is not a safe
	// directory name (^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$).
	ErrInvalidTenant = errors.New("invalid tenant")
	// ErrInvalidSample wraps TSDB validation errors for a malformed sample
	// (e.g. a native histogram whose counts do not add up): a client error.
	ErrInvalidSample = errors.New("invalid sample")
)

// PartialError reports samples that Write skipped while committing the rest.
// Err joins one example error per rejection reason, so errors.Is finds every
// promstorage sentinel involved (ErrOutOfOrderSample, ErrTooOldSample,
// ErrOutOfBounds, ErrDuplicateSampleForTimestamp, ErrInvalidSample).
type PartialError struct {
	Rejected int
	Err      error
}

func (e *PartialError) Error() string {
	return fmt.Sprintf("%d samples rejected: %v", e.Rejected, e.Err)
}

func (e *PartialError) Unwrap() error { return e.Err }
