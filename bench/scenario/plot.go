package scenario

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var targetColors = map[string]color.Color{
	"receiver":   color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"prometheus": color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	// VictoriaMetrics
	"victoriametrics": color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

// WritePNG draws accepted samples/s, p99 write latency and RSS over time for
// the first run of each target, one panel each, on the same time axis
// (seconds since that target's server was started).
func (r *Report) WritePNG(path string) error {
	panels := []struct {
		title, unit string
		xy          func(t *TargetResult) plotter.XYs
	}{
		{"accepted samples/s", "samples/s", func(t *TargetResult) plotter.XYs {
			tl := coarse(t.Timeline, 90)
			xy := make(plotter.XYs, len(tl))
			for i, p := range tl {
				xy[i] = plotter.XY{X: p.T, Y: p.SamplesPerSec}
			}
			return xy
		}},
		{"write latency p99 (requests sent in the window)", "ms", func(t *TargetResult) plotter.XYs {
			tl := coarse(t.Timeline, 90)
			xy := make(plotter.XYs, 0, len(tl))
			for _, p := range tl {
				if p.P99ms > 0 {
					xy = append(xy, plotter.XY{X: p.T, Y: p.P99ms})
				}
			}
			return xy
		}},
		{"RSS", "MiB", func(t *TargetResult) plotter.XYs {
			xy := make(plotter.XYs, len(t.RSSOverTime))
			for i, p := range t.RSSOverTime {
				xy[i] = plotter.XY{X: p.T, Y: float64(p.RSS) / (1 << 20)}
			}
			return xy
		}},
	}
	if r.Scenario == "churn" {
		panels = append(panels, struct {
			title, unit string
			xy          func(t *TargetResult) plotter.XYs
		}{"head series (prometheus_tsdb_head_series)", "series", func(t *TargetResult) plotter.XYs {
			xy := make(plotter.XYs, len(t.HeadSeriesOverTime))
			for i, p := range t.HeadSeriesOverTime {
				xy[i] = plotter.XY{X: p.T, Y: p.Series}
			}
			return xy
		}})
	}
	var firsts []*TargetResult
	seen := map[string]bool{}
	for _, t := range r.Results {
		if !seen[t.Name] && t.Load != nil {
			seen[t.Name] = true
			firsts = append(firsts, t)
		}
	}
	plots := make([][]*plot.Plot, len(panels))
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		if i == 0 {
			p.Title.Text = fmt.Sprintf("%s %s (%d active series, %d rounds): %s", r.Scenario, r.Size, r.Load.ActiveSeries, r.Load.Rounds, pn.title)
		}
		p.X.Label.Text = "seconds since server start"
		p.Y.Label.Text = pn.unit
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
		for _, t := range firsts {
			xy := pn.xy(t)
			if len(xy) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xy)
			if err != nil {
				return err
			}
			l.Color = targetColors[t.Name]
			l.Width = vg.Points(1.2)
			pts.Color = targetColors[t.Name]
			pts.Radius = vg.Points(1.2)
			p.Add(pts)
			p.Add(l)
			p.Legend.Add(t.Name, l)
			if v, ok := t.Extra["kill_at_s"]; ok && i == 2 {
				for _, x := range []float64{v, t.Extra["ready_at_s"]} {
					m, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: p.Y.Max}})
					if err == nil && x > 0 {
						m.Color = targetColors[t.Name]
						m.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
						p.Add(m)
					}
				}
			}
		}
		plots[i] = []*plot.Plot{p}
	}
	w, h := 10*vg.Inch, vg.Length(len(panels))*10*vg.Inch/3
	img := vgimg.New(w, h)
	dc := draw.New(img)
	t := draw.Tiles{Rows: len(panels), Cols: 1, PadX: vg.Millimeter, PadY: 3 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	canvases := plot.Align(plots, t, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// coarse merges groups of adjacent windows so that at most n remain (older
// results kept 200ms windows): samples/s is averaged, p50 and p99 become the
// highest of the group's (an upper bound).
func coarse(tl []TimelinePoint, n int) []TimelinePoint {
	if len(tl) <= n {
		return tl
	}
	k := (len(tl) + n - 1) / n
	out := make([]TimelinePoint, 0, n)
	for i := 0; i < len(tl); i += k {
		g := tl[i:min(i+k, len(tl))]
		m := TimelinePoint{T: g[len(g)-1].T}
		for _, p := range g {
			m.SamplesPerSec += p.SamplesPerSec / float64(len(g))
			m.P50ms, m.P99ms = max(m.P50ms, p.P50ms), max(m.P99ms, p.P99ms)
		}
		out = append(out, m)
	}
	return out
}
