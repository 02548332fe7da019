package status

import (
	"time"
)

// historyPoints is a day of one-minute points.
const historyPoints = 24 * 60

// point is a tenant's totals at one time: cumulative counters (the chart
// shows their per-minute rates) and the clusters reporting then. The
// counters start at 0 with each receiver process (run); points of earlier
// runs come from Options.HistoryFile.
type point struct {
	t         time.Time
	run       int64
	samples   uint64
	refused   []uint64 // by limiter reason index
	reporting int
}

// history is a ring of one tenant's points. Guarded by Status.mu.
type history struct {
	points [historyPoints]point
	next   int
	n      int
}

func (h *history) add(p point) {
	h.points[h.next] = p
	h.next = (h.next + 1) % historyPoints
	h.n = min(h.n+1, historyPoints)
}

// since returns the points at or after t, oldest first.
func (h *history) since(t time.Time) []point {
	var out []point
	for k := h.n; k >= 1; k-- {
		p := h.points[(h.next-k+historyPoints)%historyPoints]
		if !p.t.Before(t) {
			out = append(out, p)
		}
	}
	return out
}

// Record adds a point for every tenant the limiter knows. Run calls it
// every minute; tests call it with their clock.
func (s *Status) Record() {
	l := s.opts.Limiter
	now := s.opts.Now()
	reasons := l.Reasons()
	for _, tenant := range l.Tenants() {
		ts, _ := l.Tenant(tenant)
		p := point{t: now, run: s.run, samples: ts.Samples, refused: make([]uint64, len(reasons))}
		for i, r := range reasons {
			p.refused[i] = ts.Refused[r]
		}
		p.reporting = l.ClustersSeen(tenant, now.Add(-s.reportingWindow()))[0]
		s.mu.Lock()
		h := s.history[tenant]
		if h == nil {
			h = &history{}
			s.history[tenant] = h
		}
		h.add(p)
		s.mu.Unlock()
	}
}

// refusedSince returns tenant's refusals by reason since t. Each run's
// counters start at 0: this run's part is the current totals less those of
// its newest point at or before t (all of them if it started after t), and
// an earlier run's part is its last point less its newest point at or
// before t (up to a minute before its shutdown is not in its last point).
func (s *Status) refusedSince(tenant string, t time.Time, now map[string]uint64) map[string]uint64 {
	reasons := s.opts.Limiter.Reasons()
	total := make([]uint64, len(reasons))
	for i, r := range reasons {
		total[i] = now[r]
	}
	s.mu.Lock()
	var ps []point
	if h := s.history[tenant]; h != nil {
		ps = h.since(time.Time{})
	}
	s.mu.Unlock()
	base := map[int64][]uint64{} // per run: its newest point at or before t
	last := map[int64][]uint64{} // per earlier run: its newest point
	for _, p := range ps {
		if !p.t.After(t) {
			base[p.run] = p.refused
		}
		if p.run != s.run {
			last[p.run] = p.refused
		}
	}
	for run, end := range last {
		add(total, end)
		sub(total, base[run])
	}
	sub(total, base[s.run])
	out := map[string]uint64{}
	for i, r := range reasons {
		if total[i] > 0 {
			out[r] = total[i]
		}
	}
	return out
}

func add(a, b []uint64) {
	for i := range min(len(a), len(b)) {
		a[i] += b[i]
	}
}

// sub subtracts b from a, stopping at 0.
func sub(a, b []uint64) {
	for i := range min(len(a), len(b)) {
		a[i] -= min(a[i], b[i])
	}
}

// series is the history API's answer: one column per figure.
type seriesJSON struct {
	Step             int                  `json:"step_seconds"`
	Time             []int64              `json:"t"`
	SamplesPerSecond []float64            `json:"samples_per_second"`
	Reporting        []int                `json:"clusters_reporting"`
	RefusedPerSecond map[string][]float64 `json:"refused_per_second"`
	Sources          map[string]source    `json:"sources"`
}

func (s *Status) historyOf(tenant string, hours int) seriesJSON {
	out := seriesJSON{Step: 60, RefusedPerSecond: map[string][]float64{}, Time: []int64{}, SamplesPerSecond: []float64{}, Reporting: []int{}}
	reasons := s.opts.Limiter.Reasons()
	s.mu.Lock()
	var ps []point
	if h := s.history[tenant]; h != nil {
		ps = h.since(s.opts.Now().Add(-time.Duration(hours) * time.Hour))
	}
	s.mu.Unlock()
	refused := make([][]float64, len(reasons))
	for k := 1; k < len(ps); k++ {
		prev, p := ps[k-1], ps[k]
		secs := p.t.Sub(prev.t).Seconds()
		if secs <= 0 || p.run != prev.run { // the counters restarted: no rate across a restart
			continue
		}
		out.Time = append(out.Time, p.t.Unix())
		out.SamplesPerSecond = append(out.SamplesPerSecond, float64(p.samples-min(p.samples, prev.samples))/secs)
		out.Reporting = append(out.Reporting, p.reporting)
		for i := range reasons {
			var d uint64
			if i < len(p.refused) && i < len(prev.refused) {
				d = p.refused[i] - min(p.refused[i], prev.refused[i])
			}
			refused[i] = append(refused[i], float64(d)/secs)
		}
	}
	for i, r := range reasons {
		for _, v := range refused[i] {
			if v > 0 {
				out.RefusedPerSecond[r] = refused[i]
				break
			}
		}
	}
	out.Sources = map[string]source{
		"samples_per_second": {Metric: "phonehome_receive_samples_total", PromQL: `sum(rate(phonehome_receive_samples_total{result="accepted"}[5m]))`},
		"refused_per_second": {Metric: "phonehome_receive_rejected_samples_total", PromQL: `sum by (reason) (rate(phonehome_receive_rejected_samples_total[5m]))`},
		"clusters_reporting": {PromQL: `count(count by (_id) (count_over_time({_id!=""}[10m])))`},
	}
	return out
}
