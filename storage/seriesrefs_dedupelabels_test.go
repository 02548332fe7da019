//go:build dedupelabels

package storage

import (
	"testing"

	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// TestSeriesRefsSymbolTable: new series' labels are interned in the cache's
// table, which a head truncation replaces without breaking the labels
// already built with the old one.
func TestSeriesRefsSymbolTable(t *testing.T) {
	r := newSeriesRefs()
	old := r.symbols.Load()
	b := r.labelsBuilder()
	b.Add(model.MetricNameLabel, "csv_succeeded")
	b.Add("version", "1.2.3")
	ls := b.Labels()
	require.Equal(t, 4, old.Len(), "two names and two values interned")

	b = r.labelsBuilder()
	b.Add(model.MetricNameLabel, "csv_succeeded")
	b.Add("version", "1.2.4")
	b.Labels()
	require.Equal(t, 5, old.Len(), "only the new value added")

	r.sync(0) // the head's min time has not moved
	require.Same(t, old, r.symbols.Load())
	r.sync(7200_000)
	require.NotSame(t, old, r.symbols.Load())
	require.Zero(t, r.symbols.Load().Len())
	require.Equal(t, "1.2.3", ls.Get("version"), "labels built before keep their table")
}
