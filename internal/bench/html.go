package bench

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"sort"
	"strings"
	"time"
)

// Chart geometry of the page's SVGs.
const (
	chartW, chartH = 760, 340
	padL, padR     = 60, 20
	padT, padB     = 20, 44
)

var phaseColors = []string{"#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"}

var page = template.Must(template.New("bench").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>fleetctl bench {{.R.Date}}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:60em;color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.8em}
.meta{color:#666} table{border-collapse:collapse;margin:.6em 0}
td,th{padding:.25em .7em;border-bottom:1px solid #e4e4e4;text-align:right} th{background:#f6f6f6}
td:first-child,th:first-child{text-align:left} td.cpu{white-space:nowrap;font-size:12px}
.big{display:flex;flex-wrap:wrap;gap:1em;margin:1em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:11em}
.card b{display:block;font-size:1.6em} .card span{color:#666}
svg{background:#fff;border:1px solid #e4e4e4} svg text{font-size:11px;fill:#444}
ul{color:#555} .wide{overflow-x:auto}
</style></head><body>
<h1>fleetctl bench</h1>
<div class="meta">{{.R.Date}} · {{.R.GoVersion}}{{if .R.Commit}} · {{.R.Commit}}{{end}} · {{.R.Backend}} backend · {{.R.Instances}} instance{{if ne .R.Instances 1}}s{{end}} · {{.R.Devices}} devices · {{.R.Concurrency}} in flight · {{.R.Seconds}} s per phase · {{.R.CPUs}} CPUs</div>
<div class="big">
<div class="card"><span>pass-through</span><b>{{printf "%.1f" .R.PassthroughPerS}}/s</b></div>
<div class="card"><span>controller</span><b>{{printf "%.1f" .R.ControllerPerS}}/s</b></div>
<div class="card"><span>ratio (controller / pass-through)</span><b>{{printf "%.3f" .R.Ratio}}</b></div>
<div class="card"><span>cpu_ratio (pass-through / controller)</span><b>{{printf "%.3f" .R.CPURatio}}</b></div>
<div class="card"><span>p99 at R = {{printf "%.1f" .R.HalfLoadRate}}/s (controller / pass-through / durable floor)</span><b>{{printf "%.1f" .R.HalfLoadP99MS}} / {{printf "%.1f" .R.PassthroughHalfLoadP99MS}} / {{printf "%.1f" .R.DurableFloorHalfLoadP99MS}} ms</b></div>
<div class="card"><span>every action serial</span><b>{{printf "%.1f" .R.SerialPerS}}/s</b></div>
</div>
<h2>The targets side by side</h2>
<table><tr><th></th><th>pass-through</th><th>controller</th><th>controller, every action serial</th></tr>
<tr><td>saturated, operations/s</td><td>{{printf "%.1f" .R.PassthroughPerS}}</td><td>{{printf "%.1f" .R.ControllerPerS}} (ratio {{printf "%.3f" .R.Ratio}})</td><td>{{printf "%.1f" .R.SerialPerS}} (ratio {{printf "%.3f" .R.SerialRatio}})</td></tr>
<tr><td>saturated, p50 / p99 ms</td><td>{{printf "%.1f" .R.PassthroughP50MS}} / {{printf "%.1f" .R.PassthroughP99MS}}</td><td>{{printf "%.1f" .R.P50MS}} / {{printf "%.1f" .R.P99MS}}</td><td>{{printf "%.1f" .R.SerialP50MS}} / {{printf "%.1f" .R.SerialP99MS}}</td></tr>
<tr><td>target CPU per operation, ms</td><td>{{printf "%.3f" .R.PassthroughCPUMSPerOp}}</td><td>{{printf "%.3f" .R.ControllerCPUMSPerOp}}</td><td>{{printf "%.3f" .R.SerialCPUMSPerOp}}</td></tr>
<tr><td>at R = {{printf "%.1f" .R.HalfLoadRate}}/s, p50 / p99 ms</td><td>{{printf "%.1f" .R.PassthroughHalfLoadP50MS}} / {{printf "%.1f" .R.PassthroughHalfLoadP99MS}}</td><td>{{printf "%.1f" .R.HalfLoadP50MS}} / {{printf "%.1f" .R.HalfLoadP99MS}}</td><td></td></tr>
{{if .R.HalfLoadSubmitCommitMS}}<tr><td>at R, mean ms: the store's answer to the submit + to the receipts + the rest</td><td>{{printf "%.1f" .R.PassthroughHalfLoadMeanMS}}</td><td>{{printf "%.1f" .R.HalfLoadMeanMS}} = {{printf "%.1f" .R.HalfLoadSubmitCommitMS}} + {{printf "%.1f" .R.HalfLoadReceiptCommitMS}} + {{printf "%.1f" .R.HalfLoadOtherMS}}</td><td></td></tr>
<tr><td>at R, p99 ms of the store's answer to the submit / to the receipts (from its histogram)</td><td></td><td>{{printf "%.1f" .R.HalfLoadSubmitCommitP99MS}} / {{printf "%.1f" .R.HalfLoadReceiptCommitP99MS}}</td><td></td></tr>{{end}}
<tr><td>at R, the durable floor (reference: the pass-through syncing both answers to a log), p50 / p99 ms</td><td>{{printf "%.1f" .R.DurableFloorHalfLoadP50MS}} / {{printf "%.1f" .R.DurableFloorHalfLoadP99MS}} (p99 {{printf "%.2f" .R.DurableFloorP99Ratio}} × the pass-through's)</td><td>p99 {{printf "%.2f" .R.HalfLoadP99VsFloor}} × the floor's</td><td></td></tr>
<tr><td>database statements per operation</td><td>0</td><td>{{printf "%.2f" .R.StatementsPerOp}}</td><td>{{printf "%.2f" .R.SerialStatementsPerOp}}</td></tr>
</table>
<h2>CPU per operation, by process (ms)</h2>
<div class="wide">{{.Split}}</div>
<h2>Figures</h2>
<table>{{range .Figures}}<tr><td>{{index . 0}}</td><td>{{index . 1}}</td></tr>{{end}}</table>
<h2>Phases</h2>
<table><tr><th>phase</th><th>mode</th><th>ops/s</th><th>ops</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>max ms</th><th>errors</th><th>db rt/op</th><th>cpu ms/op</th></tr>
{{range .R.Phases}}<tr><td>{{.Name}}</td><td>{{if eq .Mode "open"}}open {{printf "%.1f" .TargetRate}}/s{{else}}closed C={{.Concurrency}}{{end}}</td>
<td>{{printf "%.1f" .PerS}}</td><td>{{.Ops}}</td><td>{{printf "%.2f" .Latency.P50}}</td><td>{{printf "%.2f" .Latency.P90}}</td>
<td>{{printf "%.2f" .Latency.P99}}</td><td>{{printf "%.2f" .Latency.P999}}</td><td>{{printf "%.2f" .Latency.Max}}</td>
<td>{{.Errors}}{{if .Skipped}} +{{.Skipped}} skipped{{end}}{{if .Unfinished}} +{{.Unfinished}} unfinished{{end}}</td>
<td>{{if .DBRoundTripsPerOp}}{{printf "%.2f" .DBRoundTripsPerOp}}{{end}}</td>
<td class="cpu">{{range .CPU}}{{.Process}} {{printf "%.3f" .MSPerOp}}<br>{{end}}</td></tr>
{{end}}</table>
<h2>Latency, cumulative (log scale)</h2>
{{.CDF}}
<h2>Controller latency at saturation, histogram (log scale)</h2>
{{.Hist}}
<h2>How it was measured</h2>
<ul>{{range .R.Notes}}<li>{{.}}</li>{{end}}
<li>controller flags (the first instance's): <code>{{range .R.ControllerArgs}}{{.}} {{end}}</code></li></ul>
{{if .R.ControllerLogSamples}}<h2>Controller warnings and errors</h2>
<ul>{{range $k, $v := .R.ControllerLogProblems}}<li>{{$k}}: {{$v}} line(s)</li>{{end}}</ul>
<pre>{{range .R.ControllerLogSamples}}{{.}}
{{end}}</pre>{{end}}
</body></html>
`))

// html renders latest.html: self-contained, no external assets.
func (r *Result) html() ([]byte, error) {
	var b bytes.Buffer
	err := page.Execute(&b, struct {
		R         *Result
		Figures   [][2]string
		CDF, Hist template.HTML
		Split     template.HTML
	}{r, r.figures(), template.HTML(r.cdfSVG()), template.HTML(histSVG(r.byName["controller"])), template.HTML(r.cpuSplit())})
	return b.Bytes(), err
}

// logAxis maps latencies onto x between lo and hi (log scale).
type logAxis struct{ lo, hi float64 }

func (a logAxis) x(msv float64) float64 {
	msv = math.Max(msv, a.lo)
	return padL + (math.Log10(msv)-math.Log10(a.lo))/(math.Log10(a.hi)-math.Log10(a.lo))*(chartW-padL-padR)
}

func axisFor(lat ...[]time.Duration) (logAxis, bool) {
	lo, hi := math.Inf(1), 0.0
	for _, l := range lat {
		for _, d := range l {
			v := float64(d) / float64(time.Millisecond)
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if hi == 0 {
		return logAxis{}, false
	}
	lo = math.Pow(10, math.Floor(math.Log10(math.Max(lo, 0.01))))
	hi = math.Pow(10, math.Ceil(math.Log10(math.Max(hi, lo*10))))
	return logAxis{lo, hi}, true
}

// xTicks draws the decades of a log axis.
func xTicks(b *strings.Builder, a logAxis) {
	for v := a.lo; v <= a.hi*1.0001; v *= 10 {
		x := a.x(v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`, x, padT, x, chartH-padB)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, chartH-padB+16, msLabel(v))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">latency (ms)</text>`, (chartW+padL)/2, chartH-6)
}

func msLabel(v float64) string {
	if v < 1 {
		return fmt.Sprintf("%g", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func sortedCopy(l []time.Duration) []time.Duration {
	s := append([]time.Duration(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

// cdfSVG draws each phase's cumulative latency distribution.
func (r *Result) cdfSVG() string {
	var lats [][]time.Duration
	for _, p := range r.Phases {
		lats = append(lats, p.latencies)
	}
	a, ok := axisFor(lats...)
	if !ok {
		return "<p>no latencies recorded</p>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="latency CDF">`,
		chartW, chartH, chartW, chartH)
	xTicks(&b, a)
	y := func(f float64) float64 { return chartH - padB - f*(chartH-padT-padB) }
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`, padL, y(f), chartW-padR, y(f))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`, padL-6, y(f)+4, f)
	}
	for i, p := range r.Phases {
		s := sortedCopy(p.latencies)
		if len(s) == 0 {
			continue
		}
		color := phaseColors[i%len(phaseColors)]
		var pts []string
		step := max(1, len(s)/400)
		for j := 0; j < len(s); j += step {
			v := float64(s[j]) / float64(time.Millisecond)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", a.x(v), y(float64(j+1)/float64(len(s)))))
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", a.x(float64(s[len(s)-1])/float64(time.Millisecond)), y(1)))
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8" points="%s"/>`, color, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="3" fill="%s"/><text x="%d" y="%d">%s (%d ops)</text>`,
			padL+10, padT+8+i*15, color, padL+28, padT+12+i*15, template.HTMLEscapeString(p.Name), len(s))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// histSVG draws one phase's latencies in log-spaced bins.
func histSVG(p *Phase) string {
	if p == nil || len(p.latencies) == 0 {
		return "<p>no latencies recorded</p>"
	}
	a, _ := axisFor(p.latencies)
	const bins = 60
	counts := make([]int, bins)
	w := (math.Log10(a.hi) - math.Log10(a.lo)) / bins
	for _, d := range p.latencies {
		v := math.Max(float64(d)/float64(time.Millisecond), a.lo)
		i := int((math.Log10(v) - math.Log10(a.lo)) / w)
		counts[max(0, min(i, bins-1))]++
	}
	top := 1
	for _, c := range counts {
		top = max(top, c)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="latency histogram">`,
		chartW, chartH, chartW, chartH)
	xTicks(&b, a)
	h := float64(chartH - padT - padB)
	for i, c := range counts {
		if c == 0 {
			continue
		}
		x0 := a.x(math.Pow(10, math.Log10(a.lo)+float64(i)*w))
		x1 := a.x(math.Pow(10, math.Log10(a.lo)+float64(i+1)*w))
		bh := float64(c) / float64(top) * h
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#1f77b4"><title>%d</title></rect>`,
			x0, float64(chartH-padB)-bh, math.Max(1, x1-x0-1), bh, c)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%d</text><text x="%d" y="%d" text-anchor="end">0</text>`,
		padL-6, padT+4, top, padL-6, chartH-padB)
	for i, m := range []struct {
		name string
		v    float64
	}{{"p50", p.Latency.P50}, {"p99", p.Latency.P99}} {
		x := a.x(m.v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#d62728" stroke-dasharray="4 3"/><text x="%.1f" y="%d">%s %.1f ms</text>`,
			x, padT, x, chartH-padB, x+3, padT+10+i*14, m.name, m.v)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// cpuRoles orders a CPU split's rows: each process named by its role.
var cpuRoles = []struct{ role, process string }{
	{"target", ""}, {"database server", "postgres"}, {"broker", "mosquitto"}, {"fleet", "devicesim"}, {"load client", "bench"},
}

// cpuSplit is a table of the target phases (columns) by process (rows,
// CPU ms per operation), each bar's width its share of the column's total.
func (r *Result) cpuSplit() string {
	var phases []*Phase
	for _, p := range r.Phases {
		if isTarget(p.Target) {
			phases = append(phases, p)
		}
	}
	if len(phases) == 0 {
		return "<p>no target phases</p>"
	}
	cell := func(p *Phase, role, process string) float64 {
		var v float64
		for _, u := range p.CPU {
			if (role == "target" && isTarget(u.Process)) || (role != "target" && u.Process == process) {
				v += u.MSPerOp
			}
		}
		return v
	}
	var b strings.Builder
	b.WriteString("<table><tr><th>process</th>")
	for _, p := range phases {
		fmt.Fprintf(&b, "<th>%s</th>", template.HTMLEscapeString(p.Name))
	}
	b.WriteString("</tr>")
	totals := make([]float64, len(phases))
	for i, p := range phases {
		for _, c := range cpuRoles {
			totals[i] += cell(p, c.role, c.process)
		}
	}
	for _, c := range cpuRoles {
		var sum float64
		for _, p := range phases {
			sum += cell(p, c.role, c.process)
		}
		if sum == 0 {
			continue // no such process in this run (a PostgreSQL server, the bench's own broker)
		}
		name := c.role
		if c.process != "" {
			name += " (" + c.process + ")"
		} else {
			name += " (pass-through, durable floor or controller)"
		}
		fmt.Fprintf(&b, "<tr><td>%s</td>", template.HTMLEscapeString(name))
		for i, p := range phases {
			v := cell(p, c.role, c.process)
			w := 0.0
			if totals[i] > 0 {
				w = v / totals[i] * 100
			}
			fmt.Fprintf(&b, `<td style="white-space:nowrap">%.3f <svg width="60" height="8" style="border:0"><rect width="%.1f" height="8" fill="#1f77b4"/></svg></td>`, v, w*0.6)
		}
		b.WriteString("</tr>")
	}
	b.WriteString("<tr><td><b>all</b></td>")
	for _, t := range totals {
		fmt.Fprintf(&b, "<td><b>%.3f</b></td>", t)
	}
	b.WriteString("</tr></table>")
	return b.String()
}
