package push

import (
	"encoding/json"

	"github.com/prometheus/prometheus/model/labels"
)

// symbols interns the label names and values of every push series. The
// receiver is built with Prometheus' dedupelabels tag (see the Makefile),
// under which labels.Labels are references into a symbol table, and
// labels.New, labels.FromMap and labels.NewScratchBuilder each make a new
// table of ~50 KB: kept once per aggregated series, those would cost far more
// than the labels themselves. The push state is one per process and holds
// every series it has seen, so one table that only grows is its size. Other
// builds ignore the table.
var symbols = labels.NewSymbolTable()

func newLabelsBuilder(n int) labels.ScratchBuilder {
	return labels.NewScratchBuilderWithSymbolTable(symbols, n)
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

// UnmarshalJSON: as delta's.
func (it *aggItem) UnmarshalJSON(b []byte) error {
	type plain aggItem
	aux := struct {
		*plain
		Labels map[string]string `json:"labels"`
	}{plain: (*plain)(it)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	it.Labels = labelsFromMap(aux.Labels)
	return nil
}
