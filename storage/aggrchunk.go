package storage

import (
	"encoding/binary"
	"errors"

	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// EncThanosAggr is the chunk encoding of Thanos' downsampled blocks
// (downsample.ChunkEncAggr): an AggrChunk, the count, sum, min, max and
// counter aggregates of a series each as its own chunk, one after the
// other as a uvarint length, the encoding byte and the chunk's bytes (length
// 0 for an absent aggregate).
const EncThanosAggr = chunkenc.Encoding(0xff)

// errAggrReencode is what a rewrite gets when TSDB would have to re-encode
// an aggregate chunk (trim it to the block's range): it cannot, so the
// rewrite fails instead of writing the chunk wrong or dropping it.
var errAggrReencode = errors.New("a chunk in Thanos' aggregate encoding cannot be re-encoded")

// aggrPool is a chunk pool that reads Thanos' aggregate chunks as opaque
// bytes next to Prometheus' own encodings, so that a rewrite copies them
// byte for byte: TSDB's block writer writes a chunk it does not re-encode
// as Encoding() and Bytes(). Other unknown encodings stay refused: a
// rewrite must know how many samples a chunk holds (a block whose chunks
// hold none is not written at all).
type aggrPool struct{ chunkenc.Pool }

func newAggrPool() chunkenc.Pool { return aggrPool{chunkenc.NewPool()} }

func (p aggrPool) Get(e chunkenc.Encoding, b []byte) (chunkenc.Chunk, error) {
	if e == EncThanosAggr {
		return &aggrChunk{b: b}, nil
	}
	return p.Pool.Get(e, b)
}

func (p aggrPool) Put(c chunkenc.Chunk) error {
	if c.Encoding() == EncThanosAggr {
		return nil
	}
	return p.Pool.Put(c)
}

// aggrChunk is an AggrChunk held as its bytes. It can be copied, not read:
// its iterator fails with errAggrReencode.
type aggrChunk struct{ b []byte }

func (c *aggrChunk) Bytes() []byte                      { return c.b }
func (*aggrChunk) Encoding() chunkenc.Encoding          { return EncThanosAggr }
func (*aggrChunk) Compact()                             {}
func (c *aggrChunk) Reset(b []byte)                     { c.b = b }
func (*aggrChunk) Appender() (chunkenc.Appender, error) { return nil, errAggrReencode }

func (*aggrChunk) Iterator(chunkenc.Iterator) chunkenc.Iterator {
	return errIterator{Iterator: chunkenc.NewNopIterator(), err: errAggrReencode}
}

// NumSamples is the number of windows, as Thanos counts them: the samples
// of the count aggregate, or of the first aggregate present. 0 when the
// payload does not decode (RewriteBlock then fails: it kept series but
// wrote no block).
func (c *aggrChunk) NumSamples() int {
	b := c.b
	for range 5 {
		n, w := binary.Uvarint(b)
		if w <= 0 {
			return 0
		}
		b = b[w:]
		if n == 0 {
			continue
		}
		// The encoding byte and n bytes must be there (n+1 may wrap), and
		// every Prometheus chunk starts with a 2-byte sample count, which
		// its NumSamples reads unchecked: a malformed block must fail the
		// rewrite, not crash the receiver.
		if n < 2 || n >= uint64(len(b)) {
			return 0
		}
		sub, err := chunkenc.FromData(chunkenc.Encoding(b[0]), b[1:n+1])
		if err != nil {
			return 0
		}
		return sub.NumSamples()
	}
	return 0
}

type errIterator struct {
	chunkenc.Iterator
	err error
}

func (it errIterator) Err() error { return it.err }
