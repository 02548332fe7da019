package upstream

import (
	"context"
	"errors"
	"time"

	"github.com/phonehome/phonehome/forward"
)

// NoBackoff makes retries immediate (tests).
func (w *Writer) NoBackoff() {
	w.sleep = func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
}

// FailSyncs makes every Append report a failed fsync after it has queued
// its record, as forward.Queue does when the write succeeds and the fsync
// does not.
func (w *Writer) FailSyncs() {
	w.appendQ = func(payloads ...[]byte) error {
		if err := w.q.Append(payloads...); err != nil {
			return err
		}
		return &forward.PartialAppendError{Appended: len(payloads), Err: errors.New("sync queue: input/output error")}
	}
}
