package forward

import "encoding/binary"

// Queue records lost without their samples being known are counted in
// phonehome_forward_dropped_records_total{reason}, next to
// phonehome_forward_dropped_samples_total: the sample count is inside the
// payload, which is the part that cannot be trusted or read.

// dropUnreadable counts and logs a record that can no longer be read back
// (the file changed under us: a disk fault, outside interference).
func (q *Queue) dropUnreadable(r recordRef, err error) {
	q.logger.Error("dropping unreadable queue record", "segment", q.segPath(r.seq), "offset", r.off, "err", err)
	q.m.corruptions.Inc()
	q.m.droppedRecords.WithLabelValues(ReasonCorrupt).Inc()
}

// dropInvalid acknowledges the record at pos, which the consumer read back
// but could not decode (a payload format this forwarder does not know), and
// counts it, unless it was evicted since Peek (it was counted then).
func (q *Queue) dropInvalid(pos Position, err error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.pendingLocked(pos) {
		q.countInvalid(pos, err)
	}
	return q.ackLocked(pos)
}

// countInvalid counts and logs a record that could not be decoded.
func (q *Queue) countInvalid(pos Position, err error) {
	q.logger.Error("dropping undecodable queue record", "segment", q.segPath(pos.seq), "offset", pos.off, "err", err)
	q.m.droppedRecords.WithLabelValues(ReasonInvalid).Inc()
}

// skippableRecord reports whether the invalid record at the start of b can
// be skipped rather than cut with everything after it, and its size: its
// length field fits b and a valid record starts right after it. A valid
// checksum there is the evidence that the length field was not what broke:
// read from a wrong length it would pass by chance once in 2^32. An invalid
// last record is not skipped: it may be a torn write, and cutting it loses
// the same.
func skippableRecord(b []byte) (int, bool) {
	n, ok := recordSize(b)
	if !ok || n == len(b) {
		return 0, false
	}
	if _, _, _, err := DecodeRecord(b[n:]); err != nil {
		return 0, false
	}
	return n, true
}

// countRecords estimates the records in b from their length fields alone
// (their checksums may fail): one bad record followed by good ones counts
// them all. Bytes that do not hold a whole record, a torn write or a
// garbled length, count as one.
func countRecords(b []byte) int {
	n := 0
	for len(b) > 0 {
		n++
		size, ok := recordSize(b)
		if !ok {
			break
		}
		b = b[size:]
	}
	return n
}

// recordSize is the size of the record at the start of b as its length
// field gives it, if that is plausible and b holds it all; its checksum is
// not checked.
func recordSize(b []byte) (int, bool) {
	if len(b) < recordHeaderSize {
		return 0, false
	}
	l := binary.BigEndian.Uint32(b[0:4])
	if l > maxRecordBytes || recordHeaderSize+int(l) > len(b) {
		return 0, false
	}
	return recordHeaderSize + int(l), true
}
