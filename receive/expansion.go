package receive

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/prometheus/prometheus/prompb"
	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// expansion bounds the memory a request's decoded structures take, as a
// multiple of its decoded size. max_decoded_bytes bounds the bytes, not what
// they become: an empty label or sample is 2 bytes on the wire and 48–64
// decoded, and an upload's histogram bucket (2 bytes) becomes a series with
// every label of its metric. Without the bound a 184 KiB upload grew the
// heap by 4.7 GiB (a review's test).
//
// It also stops a request at more samples than the limits could ever admit
// (maxSamples: the burst), which they would refuse after decoding.
//
// And it reserves what the structures take from the request's share of
// Options.MaxInflightBytes (res) as they grow.
type expansion struct {
	left       int64
	budget     int64 // left's start
	floor      int64 // below it, res must cover more
	samples    int
	maxSamples int // 0: none
	res        *reservation
}

const (
	// expansionFactor: 1.0 telemetry expands 2–9× (labels of ~20 bytes on
	// the wire become 64-byte structs), native histograms ~10×; a series of
	// one 1-byte label and one sample about 13×.
	expansionFactor = 24
	// expansionFactorV2: a 2.0 series is a few varints referencing shared
	// symbols, ~45 bytes for eight labels and a sample, and becomes the
	// same ~1 KB of structs as in 1.0 (~24×).
	expansionFactorV2 = 48
	// expansionFactorFamilies: an upload's classic histogram bucket (~12
	// bytes) becomes a series of all its metric's labels (~50×).
	expansionFactorFamilies = 64
	// expansionSlack lets a small request of tiny series through.
	expansionSlack = 1 << 20
	// generatedFactor is charged per byte of the messages the generated
	// code decodes (histograms, exemplars, metadata): a 1-byte packed bucket
	// delta becomes 8 bytes (a histogram's bulk), a 2-byte span a 40-byte
	// struct (a span-only histogram is undercharged ~3×, so 1.0's bound is
	// ~40× in that worst case, as 2.0's).
	generatedFactor = 12
)

// Decoded sizes charged per element.
const (
	labelCost    = int64(unsafe.Sizeof(prompb.Label{}))
	sampleCost   = int64(unsafe.Sizeof(prompb.Sample{}))
	seriesCost   = int64(unsafe.Sizeof(prompb.TimeSeries{}) + unsafe.Sizeof(seriesSpan{}))
	sampleV2Cost = int64(unsafe.Sizeof(writev2.Sample{}))
	seriesV2Cost = int64(unsafe.Sizeof(writev2.TimeSeries{}) + unsafe.Sizeof(seriesSpan{}))
	symbolCost   = int64(unsafe.Sizeof(""))
	refCost      = int64(unsafe.Sizeof(uint32(0)))
)

var (
	errExpands   = fmt.Errorf("decoded, the request would take too many times its size in memory; send fewer series or samples per request: %w", errTooLarge)
	errOverBurst = fmt.Errorf("more samples than the burst limit admits in one request: %w", errTooLarge)
)

// limitErr reports whether a decoder's err is a limit the request met
// (expansion, burst, in-flight bytes), which keeps its own status, rather
// than a malformed body (400).
func limitErr(err error) bool {
	return errors.Is(err, errTooLarge) || errors.Is(err, errOverloadedBytes)
}

// newExpansion starts the budget of decoding decoded bytes. res may be nil.
func newExpansion(decoded int, factor int64, maxSamples int, res *reservation) expansion {
	budget := factor*int64(decoded) + expansionSlack
	e := expansion{left: budget, budget: budget, maxSamples: maxSamples, res: res}
	e.setFloor()
	return e
}

// setFloor sets the left at which what was spent passes what res holds.
func (e *expansion) setFloor() {
	e.floor = 0
	if e.res.limited() {
		e.floor = max(0, e.budget+e.res.buffered-e.res.held)
	}
}

// sample counts one sample; errOverBurst past maxSamples.
func (e *expansion) sample() error {
	if e.samples++; e.maxSamples > 0 && e.samples > e.maxSamples {
		return errOverBurst
	}
	return nil
}

// spend takes n bytes of the budget; errExpands once it is spent, or
// errOverloadedBytes when the reservation cannot grow.
func (e *expansion) spend(n int64) error {
	if e.left -= n; e.left < e.floor {
		return e.overdrawn()
	}
	return nil
}

func (e *expansion) overdrawn() error {
	if e.left < 0 {
		return errExpands
	}
	if err := e.res.cover(e.res.buffered + e.budget - e.left); err != nil {
		return err
	}
	e.setFloor()
	return nil
}
