package fleet

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/common/model"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
)

// replicaLabels are, in order of preference, the labels whose value gets a
// "-<k>" suffix to turn the k-th copy of a template into a distinct series
// (as a cluster with more operators or namespaces would have). A template with
// none of them gets a new label replicaLabel="<k>" instead.
var replicaLabels = []string{"name", "namespace", "pod", "instance"}

const replicaLabel = "shard"

// Fleet is N clusters × M series derived from templates. Series j of a cluster
// is template j mod T, copy j/T (copy 0 is the template itself). Every cluster
// has the same label sets except for its _id. A Fleet is immutable and safe
// for concurrent use; all output is a pure function of (seed, cluster, series,
// round).
type Fleet struct {
	seed     uint64
	clusters int
	ids      []string // per cluster

	// Per series index within a cluster.
	shapes  [][]prompb.Label // sorted; the _id value is filled in per cluster
	idPos   []int            // index of the _id label in shapes[j]
	base    []float64
	counter []bool
	offset  []int64

	// Churn (see WithChurn): replaced fractions per simulated hour, and per
	// series the label whose value a new generation changes (-1: none).
	clusterChurn, seriesChurn float64
	churnPos                  []int
}

// New derives a fleet of clusters × seriesPerCluster series from templates.
func New(templates []Template, clusters, seriesPerCluster int, seed uint64) (*Fleet, error) {
	if len(templates) == 0 {
		return nil, errors.New("no templates")
	}
	if clusters <= 0 || seriesPerCluster <= 0 {
		return nil, fmt.Errorf("clusters (%d) and series per cluster (%d) must be positive", clusters, seriesPerCluster)
	}
	f := &Fleet{
		seed:     seed,
		clusters: clusters,
		ids:      make([]string, clusters),
		shapes:   make([][]prompb.Label, seriesPerCluster),
		idPos:    make([]int, seriesPerCluster),
		base:     make([]float64, seriesPerCluster),
		counter:  make([]bool, seriesPerCluster),
		offset:   make([]int64, seriesPerCluster),
		churnPos: make([]int, seriesPerCluster),
	}
	for c := range f.ids {
		f.ids[c] = clusterID(seed, c)
	}
	b := labels.NewBuilder(labels.EmptyLabels())
	for j := range seriesPerCluster {
		t := templates[j%len(templates)]
		k := j / len(templates)
		b.Reset(t.Labels)
		b.Set(ClusterLabel, "x") // placeholder, replaced per cluster
		if k > 0 {
			replicate(b, t.Labels, k)
		}
		ls := b.Labels()
		shape := make([]prompb.Label, 0, ls.Len())
		pos := -1
		ls.Range(func(l labels.Label) {
			if l.Name == ClusterLabel {
				pos = len(shape)
			}
			shape = append(shape, prompb.Label{Name: l.Name, Value: l.Value})
		})
		f.shapes[j], f.idPos[j] = shape, pos
		f.churnPos[j] = churnLabel(shape)
		f.base[j], f.counter[j], f.offset[j] = t.Value, t.Counter, t.OffsetMs
	}
	return f, nil
}

func replicate(b *labels.Builder, ls labels.Labels, k int) {
	suffix := "-" + strconv.Itoa(k)
	for _, name := range replicaLabels {
		if v := ls.Get(name); v != "" {
			b.Set(name, v+suffix)
			return
		}
	}
	b.Set(replicaLabel, strconv.Itoa(k))
}

// churnNames are, in order of preference, the labels an upgrade changes: the
// version of a component, else the identity of the replica running it.
var churnNames = []string{"version", "gitVersion", "pod", "instance", "name", "namespace", "job"}

func churnLabel(shape []prompb.Label) int {
	for _, n := range churnNames {
		for i, l := range shape {
			if l.Name == n {
				return i
			}
		}
	}
	// Otherwise the last label that is neither the name nor the cluster.
	for i := len(shape) - 1; i >= 0; i-- {
		if n := shape[i].Name; n != model.MetricNameLabel && n != ClusterLabel {
			return i
		}
	}
	return -1
}

// WithChurn returns a copy of f whose clusters and series are replaced over
// simulated time: per simulated hour a fraction clusterPerHour of the clusters
// leave and are replaced by new ones (a new _id), and a fraction seriesPerHour
// of every cluster's series are replaced by a new generation (an operator
// upgrade changes their version label; series without one change their pod,
// instance, name or, failing those, another label). Each cluster and series has a fixed phase u in [0,1);
// its generation at simulated hour h is floor(rate·h + u), so exactly
// rate·100% of them turn over per hour, spread evenly over the hour.
func (f *Fleet) WithChurn(clusterPerHour, seriesPerHour float64) *Fleet {
	g := *f
	g.clusterChurn, g.seriesChurn = clusterPerHour, seriesPerHour
	return &g
}

// generation of a cluster (j < 0) or series j of cluster c at simulated hour h.
func (f *Fleet) generation(c, j int, h float64) int {
	rate := f.seriesChurn
	if j < 0 {
		rate = f.clusterChurn
	}
	if rate <= 0 {
		return 0
	}
	u := float64(mix(f.seed, uint64(c), uint64(j+1), 0xc4)>>11) / (1 << 53)
	return int(rate*h + u)
}

// DistinctSeries is the number of different series rounds rounds of stepMs
// create (with churn, more than ActiveSeries).
func (f *Fleet) DistinctSeries(rounds int, stepMs int64) int {
	if f.clusterChurn <= 0 && f.seriesChurn <= 0 {
		return f.ActiveSeries()
	}
	h := float64(int64(rounds-1)*stepMs) / 3.6e6
	n := 0
	for c := range f.clusters {
		cg := f.generation(c, -1, h) + 1
		for j := range f.shapes {
			sg := 1
			if f.churnPos[j] >= 0 {
				sg = f.generation(c, j, h) + 1
			}
			// Generations of the cluster and of the series change independently.
			n += cg + sg - 1
		}
	}
	return n
}

// Clusters returns N.
func (f *Fleet) Clusters() int { return f.clusters }

// SeriesPerCluster returns M.
func (f *Fleet) SeriesPerCluster() int { return len(f.shapes) }

// ActiveSeries returns N × M.
func (f *Fleet) ActiveSeries() int { return f.clusters * len(f.shapes) }

// ClusterID returns the _id of cluster c.
func (f *Fleet) ClusterID(c int) string { return f.ids[c] }

// Batch is reusable scratch space for building one request's series. A Batch
// is not safe for concurrent use; the series it returns are valid until the
// next call to Fill.
type Batch struct {
	Series  []prompb.TimeSeries
	labels  []prompb.Label
	samples []prompb.Sample
}

// Fill sets b.Series to the series [from, to) of cluster c at round r, with
// timestamps t0Ms + r*stepMs (plus a per-target offset and a few ms of jitter).
func (f *Fleet) Fill(b *Batch, c, from, to, r int, t0Ms, stepMs int64) {
	n := to - from
	nl := 0
	for j := from; j < to; j++ {
		nl += len(f.shapes[j])
	}
	if cap(b.labels) < nl {
		b.labels = make([]prompb.Label, nl)
	}
	if cap(b.samples) < n {
		b.samples = make([]prompb.Sample, n)
	}
	if cap(b.Series) < n {
		b.Series = make([]prompb.TimeSeries, n)
	}
	b.labels, b.samples, b.Series = b.labels[:nl], b.samples[:n], b.Series[:n]

	id := f.ids[c]
	h := float64(int64(r)*stepMs) / 3.6e6
	if g := f.generation(c, -1, h); g > 0 {
		id = clusterID(f.seed+uint64(g)*0x9e3779b9, c)
	}
	jitter := int64(mix(f.seed, uint64(c), uint64(r), 0x6a) % 20)
	tsBase := t0Ms + int64(r)*stepMs + jitter
	off := 0
	for i := range n {
		j := from + i
		shape := f.shapes[j]
		ls := b.labels[off : off+len(shape) : off+len(shape)]
		copy(ls, shape)
		ls[f.idPos[j]].Value = id
		if p := f.churnPos[j]; p >= 0 && f.seriesChurn > 0 {
			if g := f.generation(c, j, h); g > 0 {
				ls[p].Value = shape[p].Value + "-g" + strconv.Itoa(g)
			}
		}
		off += len(shape)

		b.samples[i] = prompb.Sample{Timestamp: tsBase + f.offset[j], Value: f.value(c, j, r)}
		b.Series[i] = prompb.TimeSeries{Labels: ls, Samples: b.samples[i : i+1 : i+1]}
	}
}

// value is the value of series j of cluster c at round r. Counters grow by a
// per-series rate with jitter and never decrease; other series keep the
// fixture's value, as most telemetry series are flags and versions.
func (f *Fleet) value(c, j, r int) float64 {
	if !f.counter[j] {
		return f.base[j]
	}
	h := mix(f.seed, uint64(c), uint64(j), 0xc0)
	rate := 1 + h%20
	jit := mix(h, uint64(r), 0, 0) % rate // in [0, rate): keeps the counter monotonic
	return f.base[j] + float64(h%1000) + float64(uint64(r)*rate+jit)
}

func clusterID(seed uint64, c int) string {
	a, b := mix(seed, uint64(c), 1, 0x1d), mix(seed, uint64(c), 2, 0x1d)
	a = a&^(0xf<<12) | 4<<12         // version 4
	b = b&^(0x3<<62) | uint64(2)<<62 // variant 10
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", a>>32, (a>>16)&0xffff, a&0xffff, b>>48, b&0xffffffffffff)
}

// mix hashes its inputs with splitmix64 rounds.
func mix(a, b, c, d uint64) uint64 {
	h := splitmix(a ^ 0x9e3779b97f4a7c15)
	h = splitmix(h ^ b)
	h = splitmix(h ^ c)
	return splitmix(h ^ d)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
