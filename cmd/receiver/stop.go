package main

import (
	"log/slog"

	"github.com/phonehome/phonehome/storage"
)

// Messages of the last line of a stop. Operators retiring a replica look
// for the first with blocks_pending_upload=0 (docs/operations.md) before
// deleting its volume: keep them stable.
const (
	msgStopped     = "receiver stopped: storage closed"
	msgStopFailed  = "receiver stopped: storage close failed"
	msgLeftOnDisk  = "blocks left on the local disk only, not uploaded"
	exitStopFailed = 1 // the head flush, the upload or a close failed
)

// closeStorage closes db, which flushes the heads into blocks and uploads
// them (as configured), and logs how many blocks only the local disk
// holds, naming them if any. It returns code, or exitStopFailed if Close
// failed and code was 0: a supervisor, a script or a runbook must not take
// a stop that left data behind for a clean one.
func closeStorage(logger *slog.Logger, db *storage.DB, code int) int {
	err := db.Close()
	if err != nil {
		logger.Error("close storage", "err", err)
		if code == 0 {
			code = exitStopFailed
		}
	}
	left := db.NotUploaded()
	if len(left) > 0 {
		logger.Error(msgLeftOnDisk, "blocks", left)
	}
	if err != nil {
		logger.Error(msgStopFailed, "blocks_pending_upload", len(left), "exit_code", code)
		return code
	}
	logger.Info(msgStopped, "blocks_pending_upload", len(left), "exit_code", code) // the last line of a clean stop
	return code
}
