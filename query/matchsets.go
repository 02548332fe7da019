package query

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// Prometheus' label handlers (/labels, /label/<name>/values) ask their
// querier for one match[] set after another, each call waiting for the
// last: over peers, k sets took up to k peer timeouts when a peer does not
// answer. So the handler's context carries its request's sets
// (withMatchSets), and its querier asks for all of them at its first label
// call (labelBatch), as PromQL and the series API ask for every selector
// before they read any.

// maxParallelSets bounds the match[] sets of one label call asked at once
// (each asks every peer): a call with more sets costs up to one peer
// timeout per maxParallelSets sets.
const maxParallelSets = 16

// formMemory is what http.Request.FormValue parses a form with (its
// defaultMaxMemory).
const formMemory = 32 << 20

type matchSetsKey struct{}

// withMatchSets gives the context of a request with several match[] sets
// those sets, parsed by p, the parser of the handler it serves (so that
// they are the handler's). A match[] that does not parse is left to the
// handler, which answers the error. The form is parsed as the handler's
// first FormValue would, its error ignored as there, so that the handler
// reads the same form.
func withMatchSets(p parser.Parser, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Form == nil {
			_ = r.ParseMultipartForm(formMemory)
		}
		if match := r.Form["match[]"]; len(match) > 1 {
			if sets, err := p.ParseMetricSelectors(match); err == nil {
				r = r.WithContext(context.WithValue(r.Context(), matchSetsKey{}, sets))
			}
		}
		next.ServeHTTP(w, r)
	})
}

// matchSets returns the match[] sets withMatchSets put in ctx, if any.
func matchSets(ctx context.Context) [][]*labels.Matcher {
	sets, _ := ctx.Value(matchSetsKey{}).([][]*labels.Matcher)
	return sets
}

// labelCall is what the handler asks of every match[] set of its request:
// label names, or the values of name, of tenant, under hints.
type labelCall struct {
	tenant string
	values bool
	name   string
	hinted bool // hints is the caller's, not nil
	hints  promstorage.LabelHints
}

func newLabelCall(tenant string, values bool, name string, hints *promstorage.LabelHints) labelCall {
	c := labelCall{tenant: tenant, values: values, name: name, hinted: hints != nil}
	if hints != nil {
		c.hints = *hints
	}
	return c
}

// labelAsk makes the label call for one match[] set.
type labelAsk func(ctx context.Context, ms []*labels.Matcher) ([]string, annotations.Annotations, error)

// labelBatch asks for every match[] set of one label call, at most
// maxParallelSets at a time, in the request's order (the handler's), and
// keeps each answer until the handler has taken it.
type labelBatch struct {
	call   labelCall
	index  map[string]int // answers by setKey
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex // guards answers' uses, and their results once done
	answers []labelAnswer
}

type labelAnswer struct {
	done chan struct{} // closed once res is written
	uses int           // the request's sets with this answer still to take it
	res  labelResult
}

// labelResult is a label call's answer.
type labelResult struct {
	vals []string
	ws   annotations.Annotations
	err  error
	// panicked is the call's panic, with the stack it was raised on, raised
	// again by answer.
	panicked any
}

// startLabelBatch starts asking for sets, with ask, under ctx (or until
// stop). A set given twice is asked once.
func startLabelBatch(ctx context.Context, call labelCall, sets [][]*labels.Matcher, ask labelAsk) *labelBatch {
	ctx, cancel := context.WithCancel(ctx)
	b := &labelBatch{call: call, index: map[string]int{}, cancel: cancel}
	var distinct [][]*labels.Matcher
	for _, ms := range sets {
		k := setKey(ms)
		i, ok := b.index[k]
		if !ok {
			i = len(distinct)
			b.index[k] = i
			distinct = append(distinct, ms)
			b.answers = append(b.answers, labelAnswer{done: make(chan struct{})})
		}
		b.answers[i].uses++
	}
	var next atomic.Int64
	for range min(maxParallelSets, len(distinct)) {
		b.wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(distinct); i = int(next.Add(1)) - 1 {
				r := askRecovering(ctx, ask, distinct[i])
				b.mu.Lock()
				b.answers[i].res = r
				b.mu.Unlock()
				close(b.answers[i].done)
			}
		})
	}
	return b
}

// askRecovering makes the label call for ms unless ctx has ended (stopped,
// or the caller left). A panic of the call is caught: in a goroutine of the
// batch it would end the process, where asked by the handler itself it
// failed the request only (net/http recovers it).
func askRecovering(ctx context.Context, ask labelAsk, ms []*labels.Matcher) (r labelResult) {
	defer func() {
		if p := recover(); p != nil {
			r = labelResult{panicked: fmt.Sprintf("%v [in a label call of a match[] set]\n%s", p, debug.Stack())}
		}
	}()
	if r.err = ctx.Err(); r.err == nil {
		r.vals, r.ws, r.err = ask(ctx, ms)
	}
	return r
}

// answer waits for the answer to ms of call; false if the batch was not
// asked for it (another call, or a set not of the request). A call that
// panicked panics again here, on the handler's goroutine, as it did when
// the handler made it.
func (b *labelBatch) answer(call labelCall, ms []*labels.Matcher) (labelResult, bool) {
	i, ok := b.index[setKey(ms)]
	if call != b.call || !ok {
		return labelResult{}, false
	}
	<-b.answers[i].done
	b.mu.Lock()
	a := &b.answers[i]
	r := a.res
	if a.uses--; a.uses == 0 { // not held once every set asking for it has it
		a.res = labelResult{}
	}
	b.mu.Unlock()
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r, true
}

// stop cancels the calls not yet answered (the handler stopped at an
// error) and waits for every call to end.
func (b *labelBatch) stop() {
	b.cancel()
	b.wg.Wait()
}

// setKey identifies a match[] set by its matchers, in order.
func setKey(ms []*labels.Matcher) string {
	var sb strings.Builder
	for i, m := range ms {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(m.String())
	}
	return sb.String()
}
