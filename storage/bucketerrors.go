package storage

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"strings"

	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"
)

// fsBucket is the filesystem provider with errors that name their file
// once. The provider wraps the *fs.PathError of os.Stat (and of writes and
// removals), which already names the file, with "stat <file>": every
// upload and bucket sync error read "stat X: stat X: not a directory".
type fsBucket struct{ *filesystem.Bucket }

func (b fsBucket) Iter(ctx context.Context, dir string, f func(string) error, opts ...objstore.IterOption) error {
	return pathOnce(b.Bucket.Iter(ctx, dir, f, opts...))
}

func (b fsBucket) IterWithAttributes(ctx context.Context, dir string, f func(objstore.IterObjectAttributes) error, opts ...objstore.IterOption) error {
	return pathOnce(b.Bucket.IterWithAttributes(ctx, dir, f, opts...))
}

func (b fsBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	r, err := b.Bucket.Get(ctx, name)
	return r, pathOnce(err)
}

func (b fsBucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	r, err := b.Bucket.GetRange(ctx, name, off, length)
	return r, pathOnce(err)
}

func (b fsBucket) Attributes(ctx context.Context, name string) (objstore.ObjectAttributes, error) {
	a, err := b.Bucket.Attributes(ctx, name)
	return a, pathOnce(err)
}

func (b fsBucket) Exists(ctx context.Context, name string) (bool, error) {
	ok, err := b.Bucket.Exists(ctx, name)
	return ok, pathOnce(err)
}

func (b fsBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	return pathOnce(b.Bucket.Upload(ctx, name, r, opts...))
}

func (b fsBucket) Delete(ctx context.Context, name string) error {
	return pathOnce(b.Bucket.Delete(ctx, name))
}

// pathOnce returns the *fs.PathError inside err when err only prefixes it
// with an operation on the same path ("stat X: stat X: ..." becomes
// "stat X: ..."), and err otherwise. The provider's IsObjNotFoundErr
// still recognises the result.
func pathOnce(err error) error {
	var pe *fs.PathError
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	prefix, ok := strings.CutSuffix(err.Error(), ": "+pe.Error())
	if !ok || !strings.HasSuffix(prefix, " "+pe.Path) {
		return err
	}
	return pe
}
