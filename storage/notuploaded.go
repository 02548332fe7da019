package storage

// NotUploaded returns the blocks Close left on local disk without a copy in
// the bucket, as "tenant/ULID" by tenant then time: those of a failed upload,
// of a tenant whose shipping an erasure holds, or all of them with
// upload_on_shutdown off. Before Close it returns nil. An operator must
// not delete the storage path while it names any (docs/operations.md).
func (db *DB) NotUploaded() []string {
	db.shipMtx.Lock()
	defer db.shipMtx.Unlock()
	return db.leftLocal
}

// notUploadedLocked lists the local blocks not marked uploaded. db.shipMtx
// must be held, so that no ship round marks or deletes blocks meanwhile.
func (db *DB) notUploadedLocked() []string {
	var left []string
	for _, t := range db.snapshotTenants() {
		for _, b := range t.db.Blocks() {
			if id := b.Meta().ULID; !t.isUploaded(id) {
				left = append(left, t.name+"/"+id.String())
			}
		}
	}
	return left
}
