package push

// pendingState is what the records written to the log but not yet durable
// will make of one tenant's state once their fsync succeeds. The state
// itself holds only durable records (a push whose fsync fails must not
// count), so appendLocked validates a record against the state seen through
// the pending records (view): the records that share a group commit then
// apply without conflict, in Seq order, when it succeeds, and concurrent
// pushes to one series still sum exactly. Rebuilt from the pending records
// whenever some of them are settled.
type pendingState struct {
	types   map[string]string
	layouts map[string]string
	values  map[string]float64 // by series key: the value after the pending records
	gone    map[string]bool    // series keys a pending record evicts
	delta   int                // series held after the pending records, minus the state's
}

func newPendingState() *pendingState {
	return &pendingState{types: map[string]string{}, layouts: map[string]string{}, values: map[string]float64{}, gone: map[string]bool{}}
}

// view is one tenant's state as the pending records will leave it. Neither
// field is nil.
type view struct {
	ts *tenantState
	ps *pendingState
}

func (v view) typeOf(name string) (string, bool) {
	if t, ok := v.ps.types[name]; ok {
		return t, true
	}
	t, ok := v.ts.Types[name]
	return t, ok
}

func (v view) layout(k string) (string, bool) {
	if l, ok := v.ps.layouts[k]; ok {
		return l, l != "" // "": evicted
	}
	l, ok := v.ts.Layouts[k]
	return l, ok
}

// value is the series' aggregate and whether it is held at all.
func (v view) value(k string) (float64, bool) {
	if x, ok := v.ps.values[k]; ok {
		return x, true
	}
	if v.ps.gone[k] {
		return 0, false
	}
	if it, ok := v.ts.Series[k]; ok {
		return it.Value, true
	}
	return 0, false
}

// series is how many series are held.
func (v view) series() int { return len(v.ts.Series) + v.ps.delta }

// add notes what rec, validated against v, will change (as tenantState.apply).
func (v view) add(rec *record) {
	for _, e := range rec.Evict {
		k := seriesKey(e.Labels)
		if _, ok := v.value(k); ok {
			v.ps.delta--
		}
		delete(v.ps.values, k)
		v.ps.gone[k] = true
		if lk, ok := layoutKeyOf(e.Labels); ok {
			if _, has := v.layout(lk); has {
				v.ps.layouts[lk] = "" // a histogram is evicted whole (evictUnit)
			}
		}
	}
	for k, t := range rec.Types {
		v.ps.types[k] = t
	}
	for k, l := range rec.Layouts {
		v.ps.layouts[k] = l
	}
	for _, d := range rec.Samples {
		k := seriesKey(d.Labels)
		x, ok := v.value(k)
		if !ok {
			v.ps.delta++
		}
		if d.Set {
			x = d.Value
		} else {
			x += d.Value
		}
		v.ps.values[k] = x
	}
}

// commitGroup is the records that share one fsync. done and err are set
// once, under the Gateway's syncMu, when the fsync has succeeded or failed
// (or a failure before it refused the group).
type commitGroup struct {
	done bool
	err  error
}
