package load

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"pdlb/lb/admit"
)

// Plot file names WritePlots writes.
const (
	PlotTTFTCDF  = "ttft_cdf.png"
	PlotTPOTCDF  = "tpot_cdf.png"
	PlotE2ECDF   = "e2e_cdf.png"
	PlotTTFTTime = "ttft_over_time.png"
)

// Chart size: readable on a laptop screen and in a Markdown page.
const (
	plotWidth  = 9 * vg.Inch
	plotHeight = 5.5 * vg.Inch
)

// classColors tell the classes apart in every chart; sloColor marks
// targets and failColor failed requests.
var (
	classColors = [admit.NumClasses]color.Color{
		admit.Interactive: color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		admit.Batch:       color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	}
	sloColor  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	failColor = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
)

// WritePlots writes the report's charts as PNG files into dir (created if
// missing) and returns their paths: latency CDFs of TTFT, TPOT and
// end-to-end latency, one line per priority class with its SLO marked, and
// TTFT over the run's time, failed requests marked.
func (r *Report) WritePlots(dir string, title string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	save := func(p *plot.Plot, name string) error {
		path := filepath.Join(dir, name)
		if err := p.Save(plotWidth, plotHeight, path); err != nil {
			return fmt.Errorf("load: plot %s: %w", path, err)
		}
		paths = append(paths, path)
		return nil
	}
	cdfs := []struct {
		name, metric string
		q            Quantiles
		value        func(*Result) (float64, bool)
		slo          func(SLO) float64
	}{
		{PlotTTFTCDF, "TTFT (time to first token)", r.TTFT,
			func(x *Result) (float64, bool) { return x.TTFT, x.Outcome == OK }, func(s SLO) float64 { return s.TTFT }},
		{PlotTPOTCDF, "TPOT (time per output token)", r.TPOT,
			func(x *Result) (float64, bool) { return x.TPOT, x.HasTPOT() }, func(s SLO) float64 { return s.TPOT }},
		{PlotE2ECDF, "end-to-end latency", r.E2E,
			func(x *Result) (float64, bool) { return x.E2E, x.Outcome == OK }, func(SLO) float64 { return 0 }},
	}
	for _, c := range cdfs {
		p := r.cdfPlot(title, c.metric, c.q, c.value, c.slo)
		if err := save(p, c.name); err != nil {
			return paths, err
		}
	}
	return paths, save(r.ttftTimePlot(title), PlotTTFTTime)
}

// newPlot returns a plot with a title, axis labels and a grid.
func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.X.Label.Text, p.Y.Label.Text = x, y
	p.Add(plotter.NewGrid())
	// The legend sits at the right, inset from the axes.
	p.Legend.XOffs = -vg.Points(6)
	return p
}

// cdfPlot draws the distribution of one latency: for each class the share
// of its measured requests at or below x milliseconds, and its SLO (when
// it has one) as a dashed vertical line.
func (r *Report) cdfPlot(title, metric string, q Quantiles, value func(*Result) (float64, bool), slo func(SLO) float64) *plot.Plot {
	p := newPlot(fmt.Sprintf("%s: %s CDF\np50 %s ms, p90 %s ms, p99 %s ms over %d requests", title, metric, ms(q.P50), ms(q.P90), ms(q.P99), q.N),
		metric+" (ms)", "requests at or below (%)")
	p.Y.Min, p.Y.Max = 0, 100
	p.X.Min = 0
	// Curves climb to the top right; the bottom right stays empty.
	p.Legend.YOffs = vg.Points(6)
	right := q.Max * 1000
	for c := range admit.NumClasses {
		var xs []float64
		for i := range r.Results {
			x := &r.Results[i]
			if v, ok := value(x); ok && x.Class == c {
				xs = append(xs, v*1000)
			}
		}
		if len(xs) == 0 {
			continue
		}
		slices.Sort(xs)
		// A step per request: the curve reaches 100% at the largest value.
		pts := make(plotter.XYs, 0, 2*len(xs))
		for i, v := range xs {
			pts = append(pts, plotter.XY{X: v, Y: 100 * float64(i) / float64(len(xs))}, plotter.XY{X: v, Y: 100 * float64(i+1) / float64(len(xs))})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			panic("BUG: load: CDF points: " + err.Error())
		}
		l.Color, l.Width = classColors[c], vg.Points(2)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%d)", c, len(xs)), l)
		right = max(right, addSLO(p, c, slo(r.slo(c))*1000, q.Max*1000, 100, true))
	}
	// A margin, so the last step and an SLO at the edge stay visible.
	p.X.Max = 1.05 * right
	return p
}

// sloReach is how far past the data's largest value an SLO line may widen
// an axis; a farther target (batch's minute against millisecond answers)
// would squash the data into a corner, so it is only named in the legend.
const sloReach = 2

// addSLO marks class c's target v (ms) on p: a dashed line across the
// chart (length span) when v is within reach of dataMax, else a legend
// entry alone. Zero v is no target. It returns v if it drew the line, else
// 0.
func addSLO(p *plot.Plot, c admit.Class, v, dataMax, span float64, vertical bool) float64 {
	if v <= 0 {
		return 0
	}
	label := fmt.Sprintf("%s SLO %s", c, human(v/1000))
	if v > sloReach*dataMax {
		p.Legend.Add(label+" (off the chart)", sloLine(0, 0, 0, vertical))
		return 0
	}
	p.Add(sloLine(v, 0, span, vertical))
	p.Legend.Add(label, sloLine(0, 0, 0, vertical))
	return v
}

// human formats seconds as "2 s" or "100 ms".
func human(s float64) string {
	if s >= 1 {
		return strconv.FormatFloat(s, 'g', 4, 64) + " s"
	}
	return strconv.FormatFloat(s*1000, 'g', 4, 64) + " ms"
}

// slo returns class c's targets as the report recorded them.
func (r *Report) slo(c admit.Class) SLO {
	for _, cr := range r.Classes {
		if cr.Class == c.String() {
			return SLO{TTFT: cr.TTFTSLO, TPOT: cr.TPOTSLO}
		}
	}
	return SLO{}
}

// sloLine is a dashed line at x = v from y0 to y1 (vertical) or at y = v
// from x y0 to y1 (horizontal).
func sloLine(v, from, to float64, vertical bool) *plotter.Line {
	pts := plotter.XYs{{X: from, Y: v}, {X: to, Y: v}}
	if vertical {
		pts = plotter.XYs{{X: v, Y: from}, {X: v, Y: to}}
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		panic("BUG: load: SLO line: " + err.Error())
	}
	l.Color, l.Width, l.Dashes = sloColor, vg.Points(1.5), []vg.Length{vg.Points(6), vg.Points(4)}
	return l
}

// ttftTimePlot draws each OK request's TTFT against when it was sent, by
// class, with the TTFT SLOs as dashed lines and failed or lost requests as
// crosses on the time axis, so a person sees when the target fell behind.
func (r *Report) ttftTimePlot(title string) *plot.Plot {
	p := newPlot(fmt.Sprintf("%s: TTFT over the run\n%d requests, %d ok, %d failed or lost", title, r.Requests, r.OK, r.Requests-r.OK),
		"request sent at (s since start)", "TTFT (ms)")
	p.Y.Min = 0
	p.Legend.Top, p.Legend.YOffs = true, -vg.Points(6) // points gather at the bottom
	end := r.Duration
	top := r.TTFT.Max * 1000
	var failed plotter.XYs
	for c := range admit.NumClasses {
		var pts plotter.XYs
		for i := range r.Results {
			x := &r.Results[i]
			switch {
			case x.Class != c:
			case x.Outcome == OK:
				pts = append(pts, plotter.XY{X: x.Start, Y: x.TTFT * 1000})
			default:
				failed = append(failed, plotter.XY{X: x.Start, Y: 0})
			}
		}
		if len(pts) == 0 {
			continue
		}
		s, err := plotter.NewScatter(pts)
		if err != nil {
			panic("BUG: load: scatter points: " + err.Error())
		}
		s.GlyphStyle = draw.GlyphStyle{Color: classColors[c], Radius: vg.Points(2), Shape: draw.CircleGlyph{}}
		p.Add(s)
		p.Legend.Add(fmt.Sprintf("%s (%d)", c, len(pts)), s)
		top = max(top, addSLO(p, c, r.slo(c).TTFT*1000, r.TTFT.Max*1000, end, false))
	}
	if len(failed) > 0 {
		s, err := plotter.NewScatter(failed)
		if err != nil {
			panic("BUG: load: scatter points: " + err.Error())
		}
		s.GlyphStyle = draw.GlyphStyle{Color: failColor, Radius: vg.Points(4), Shape: draw.CrossGlyph{}}
		p.Add(s)
		p.Legend.Add(fmt.Sprintf("failed or lost (%d)", len(failed)), s)
	}
	// Head room for the legend above the highest point.
	p.Y.Max = 1.35 * top
	return p
}
