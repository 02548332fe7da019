package push

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/prometheus/prometheus/model/labels"
)

// symbols interns the label names and values of the aggregated push series.
// The receiver is built with Prometheus' dedupelabels tag (see the Makefile),
// under which labels.Labels are references into a symbol table, and
// labels.New, labels.FromMap, labels.NewScratchBuilder and Labels'
// UnmarshalJSON each make a new table of ~70 KB: kept once per aggregated
// series, those would cost far more than the labels themselves. The state is
// one per process and keeps every series it has accepted, so one table that
// only grows is its size. Only what the state keeps is interned: a push
// builds its labels in a table of its own (buildRecord), so a refused push
// adds nothing here. A table never forgets a string, so the strings of
// series the state drops (evicted, expired, erased) would stay for good:
// a token holder pushing junk label values once per flush, each evicted
// for the next, would grow it without bound. The Gateway moves what it
// holds into a new table once it has dropped as many series as it holds
// (reinternLocked), and at every erasure. Used under the Gateway's mutex,
// or by openState before the Gateway exists: a table must not grow under a
// concurrent build (Prometheus' ScratchBuilder.Labels reads it unlocked).
// Other builds ignore the table.
var symbols = labels.NewSymbolTable()

// minDroppedForReintern spares a small state a new table at every flush.
const minDroppedForReintern = 64

// reinternLocked moves the labels of every series held into a new table,
// leaving the strings of the dropped ones to the garbage collector with the
// old table. Labels built in the old one stay valid (they point to it), and
// series keys do not depend on the table. Called with mu held and no
// record pending (their evictions name series by the old table's labels;
// harmless, but nothing should hold it longer than needed), and with
// flushMu held before a flush copies the state (or by Erase): it changes the
// items in place (it keeps their identity, which the eviction bookkeeping
// goes by), so no flush may be reading a copy of them (aggItem).
func (g *Gateway) reinternLocked() {
	symbols = labels.NewSymbolTable()
	for _, ts := range g.state {
		for _, it := range ts.Series {
			it.Labels = intern(it.Labels)
		}
	}
	g.dropped = 0
}

// noteDroppedLocked counts series dropped from the state and renews the
// table once they are as many as those held. Called as reinternLocked.
func (g *Gateway) noteDroppedLocked(n int) {
	g.dropped += n
	held := 0
	for _, ts := range g.state {
		held += len(ts.Series)
	}
	if g.dropped >= max(held, minDroppedForReintern) {
		g.reinternLocked()
	}
}

func newLabelsBuilder(n int) labels.ScratchBuilder {
	return labels.NewScratchBuilderWithSymbolTable(symbols, n)
}

// intern rebuilds ls in symbols, for the labels of a series the state keeps.
func intern(ls labels.Labels) labels.Labels {
	b := newLabelsBuilder(ls.Len())
	ls.Range(func(l labels.Label) { b.Add(l.Name, l.Value) })
	return b.Labels()
}

// labelsFromMap is labels.FromMap into symbols.
func labelsFromMap(m map[string]string) labels.Labels {
	b := newLabelsBuilder(len(m))
	for n, v := range m {
		b.Add(n, v)
	}
	b.Sort()
	return b.Labels()
}

// UnmarshalJSON decodes the labels into symbols (labels.Labels' own decoder
// would make a table per series); the other fields as usual.
func (d *delta) UnmarshalJSON(b []byte) error {
	type plain delta // without this method
	aux := struct {
		*plain
		Labels map[string]string `json:"labels"` // shadows plain.Labels
	}{plain: (*plain)(d)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	d.Labels = labelsFromMap(aux.Labels)
	return nil
}

// UnmarshalJSON: as delta's, and a value as MarshalJSON writes it (a
// number, or a quoted non-finite one).
func (it *aggItem) UnmarshalJSON(b []byte) error {
	type plain aggItem
	aux := struct {
		*plain
		Labels map[string]string `json:"labels"`
		Value  json.RawMessage   `json:"value"`
	}{plain: (*plain)(it)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	it.Labels = labelsFromMap(aux.Labels)
	it.Value = 0
	if len(aux.Value) > 0 && aux.Value[0] == '"' {
		var s string
		if err := json.Unmarshal(aux.Value, &s); err != nil {
			return err
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("aggregate value %q: %w", s, err)
		}
		it.Value = v
		return nil
	}
	if len(aux.Value) > 0 {
		return json.Unmarshal(aux.Value, &it.Value)
	}
	return nil
}
