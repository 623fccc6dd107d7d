// Package report writes one self-contained HTML file for a run: the
// invariant verdicts, counts by state, and for each command of interest a
// timeline drawn as SVG (publishes, queries, re-sends, receipts as the
// controller got them and as the device published them, executions, presence
// changes, the final state), so a person sees the failure window and how it
// closed.
package report

import (
	"context"
	"fmt"
	"html/template"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/verify"
	"github.com/fleetctl/fleetctl/internal/witness"
)

// Config says what to read.
type Config struct {
	DB       string
	StateDir string
	Title    string
	Max      int // commands drawn, most eventful first (default 12)
}

type mark struct {
	At    time.Time
	Lane  int
	Label string
	Color string
	Shape string // circle, triangle, square
}

type timeline struct {
	CommandID, OperationID, Device, Status, Why string
	SVG                                         template.HTML
}

type countRow struct {
	Name string
	N    int
}

type page struct {
	Title      string
	Generated  string
	Verdicts   []verify.Verdict
	Operations []countRow
	Commands   []countRow
	Effects    []countRow
	Timelines  []timeline
}

var lanes = []string{"controller decisions", "queries", "receipts received", "device published", "device executed", "presence"}

// Write renders the report.
func Write(ctx context.Context, w io.Writer, cfg Config) error {
	if cfg.Max <= 0 {
		cfg.Max = 12
	}
	vs, err := verify.Run(ctx, verify.Config{DB: cfg.DB, StateDir: cfg.StateDir, Slack: time.Minute})
	if err != nil {
		return err
	}
	a, err := backend.OpenAudit(ctx, cfg.DB)
	if err != nil {
		return err
	}
	defer a.Close()
	p := page{Title: cfg.Title, Generated: time.Now().UTC().Format(time.RFC3339), Verdicts: vs}
	if p.Title == "" {
		p.Title = "fleetctl run report"
	}
	for _, q := range []struct {
		dst   *[]countRow
		count func(context.Context) ([]store.AuditCount, error)
	}{
		{&p.Operations, a.OperationsByStatus},
		{&p.Commands, a.CommandsByStatus},
		{&p.Effects, a.ReceiptsByEffect},
	} {
		counts, err := q.count(ctx)
		if err != nil {
			return err
		}
		for _, c := range counts {
			*q.dst = append(*q.dst, countRow{Name: c.Name, N: c.N})
		}
	}
	var execs []witness.Execution
	var pubs []witness.PublishedReceipt
	if cfg.StateDir != "" {
		if execs, err = witness.ReadExecutions(cfg.StateDir); err != nil {
			return err
		}
		if pubs, err = witness.ReadReceipts(cfg.StateDir); err != nil {
			return err
		}
	}
	// The most eventful commands first.
	picks, err := a.EventfulCommands(ctx, cfg.Max)
	if err != nil {
		return err
	}
	for _, k := range picks {
		marks, err := commandMarks(ctx, a, k.CommandID, k.DeviceID, execs, pubs)
		if err != nil {
			return err
		}
		why := fmt.Sprintf("%d publishes, %d queries", k.Attempt, k.Queries)
		if k.LateOutcome != "" {
			why += ", late outcome " + k.LateOutcome
		}
		p.Timelines = append(p.Timelines, timeline{CommandID: k.CommandID, OperationID: k.OperationID, Device: k.DeviceID,
			Status: string(k.Status), Why: why, SVG: draw(marks)})
	}
	return pageTmpl.Execute(w, p)
}

func commandMarks(ctx context.Context, a *store.Audit, id, device string, execs []witness.Execution, pubs []witness.PublishedReceipt) ([]mark, error) {
	var ms []mark
	events, err := a.EventsOf(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, e := range events {
		label, color := e.To, "#2563eb"
		if e.From == e.To {
			label = e.Reason
		}
		if strings.HasPrefix(e.Reason, "publish attempt") && e.From == e.To {
			label, color = "re-send "+strings.TrimPrefix(e.Reason, "publish "), "#d97706"
		}
		if e.Refused {
			label, color = "refused "+e.To+" ("+e.Reason+")", "#dc2626"
		}
		switch e.To {
		case "succeeded":
			color = "#16a34a"
		case "failed", "timeout", "needs_attention", "cancelled":
			color = "#dc2626"
		}
		ms = append(ms, mark{At: e.At, Lane: 0, Label: label, Color: color, Shape: "circle"})
	}
	queries, err := a.Queries(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, q := range queries {
		label := "query"
		if q.AnsweredAt != nil {
			label += " → " + q.Answer
		} else {
			label += " (no answer)"
		}
		ms = append(ms, mark{At: q.SentAt, Lane: 1, Label: label, Color: "#7c3aed", Shape: "triangle"})
	}
	receipts, err := a.Receipts(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, r := range receipts {
		color := "#16a34a"
		if r.Effect != store.EffectApplied {
			color = "#9ca3af"
		}
		label := r.Status + " (" + r.Effect + ")"
		if r.QueryID != "" {
			label += " answer"
		}
		ms = append(ms, mark{At: r.ReceivedAt, Lane: 2, Label: label, Color: color, Shape: "square"})
	}
	for _, r := range pubs {
		if r.CommandID == id {
			ms = append(ms, mark{At: r.At, Lane: 3, Label: "published " + string(r.Status), Color: "#0891b2", Shape: "square"})
		}
	}
	for _, e := range execs {
		if e.CommandID == id {
			ms = append(ms, mark{At: e.At, Lane: 4, Label: "executed " + e.Action, Color: "#111827", Shape: "circle"})
		}
	}
	if len(ms) > 0 {
		lo, hi := span(ms)
		presence, err := a.PresenceEvents(ctx, device, lo.Add(-500*time.Millisecond), hi.Add(500*time.Millisecond))
		if err != nil {
			return nil, err
		}
		for _, e := range presence {
			color := "#16a34a"
			if e.To == "offline" {
				color = "#dc2626"
			}
			ms = append(ms, mark{At: e.At, Lane: 5, Label: e.To + " (" + e.Reason + ")", Color: color, Shape: "triangle"})
		}
	}
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].At.Before(ms[j].At) })
	return ms, nil
}

func span(ms []mark) (time.Time, time.Time) {
	lo, hi := ms[0].At, ms[0].At
	for _, m := range ms {
		if m.At.Before(lo) {
			lo = m.At
		}
		if m.At.After(hi) {
			hi = m.At
		}
	}
	return lo, hi
}

// draw lays the marks out on lanes along a time axis.
func draw(ms []mark) template.HTML {
	const width, left, laneH, top = 1100.0, 170.0, 52.0, 30.0
	height := top + laneH*float64(len(lanes)) + 30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="10">`, width, height)
	for i, name := range lanes {
		y := top + laneH*float64(i) + laneH/2
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#e5e7eb"/><text x="4" y="%.1f" font-size="11" fill="#374151">%s</text>`,
			left, y, width-10, y, y+4, template.HTMLEscapeString(name))
	}
	if len(ms) == 0 {
		b.WriteString(`</svg>`)
		return template.HTML(b.String())
	}
	lo, hi := span(ms)
	total := hi.Sub(lo)
	if total <= 0 {
		total = time.Millisecond
	}
	x := func(t time.Time) float64 { return left + 10 + (width-left-40)*float64(t.Sub(lo))/float64(total) }
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="#6b7280">0 ms</text><text x="%.0f" y="%.0f" fill="#6b7280" text-anchor="end">%s</text>`,
		left+10, height-8, width-30, height-8, total.Round(time.Millisecond))
	lastX := map[int]float64{}
	row := map[int]int{}
	for _, m := range ms {
		cx := x(m.At)
		y := top + laneH*float64(m.Lane) + laneH/2
		if cx-lastX[m.Lane] < 90 {
			row[m.Lane] = (row[m.Lane] + 1) % 3
		} else {
			row[m.Lane] = 0
		}
		lastX[m.Lane] = cx
		ly := y - 8 - float64(row[m.Lane])*10
		switch m.Shape {
		case "triangle":
			fmt.Fprintf(&b, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"/>`, cx, y-6, cx-6, y+5, cx+6, y+5, m.Color)
		case "square":
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="10" height="10" fill="%s"/>`, cx-5, y-5, m.Color)
		default:
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="6" fill="%s"/>`, cx, y, m.Color)
		}
		tx, anchor := cx+7, "start"
		if cx > width-180 {
			tx, anchor = cx-7, "end" // keep labels near the right edge inside the picture
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#111827" text-anchor="%s"><title>%s</title>%s</text>`, tx, ly, anchor,
			template.HTMLEscapeString(m.At.UTC().Format("15:04:05.000")+" "+m.Label), template.HTMLEscapeString(m.Label))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

var pageTmpl = template.Must(template.New("report").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body{font-family:sans-serif;margin:24px;color:#111827;background:#fff}
table{border-collapse:collapse;margin:8px 0 18px}td,th{border:1px solid #d1d5db;padding:4px 10px;text-align:left}
.pass{color:#15803d;font-weight:bold}.fail{color:#b91c1c;font-weight:bold}
.tl{margin:14px 0 26px;border:1px solid #e5e7eb;padding:8px}h3{margin:4px 0;font-size:14px}
.counts{display:flex;gap:28px}
</style></head><body>
<h1>{{.Title}}</h1><p>generated {{.Generated}}</p>
<h2>Invariants</h2>
<table><tr><th>#</th><th>invariant</th><th>verdict</th><th>numbers</th></tr>
{{range .Verdicts}}<tr><td>{{.N}}</td><td>{{.Name}}</td><td class="{{if .OK}}pass{{else}}fail{{end}}">{{if .OK}}PASS{{else}}FAIL{{end}}</td><td>{{.Detail}}</td></tr>{{end}}
</table>
<div class="counts">
<div><h2>Operations</h2><table>{{range .Operations}}<tr><td>{{.Name}}</td><td>{{.N}}</td></tr>{{end}}</table></div>
<div><h2>Commands</h2><table>{{range .Commands}}<tr><td>{{.Name}}</td><td>{{.N}}</td></tr>{{end}}</table></div>
<div><h2>Receipts by effect</h2><table>{{range .Effects}}<tr><td>{{.Name}}</td><td>{{.N}}</td></tr>{{end}}</table></div>
</div>
<h2>Commands of interest</h2>
{{range .Timelines}}<div class="tl"><h3>{{.CommandID}} — {{.OperationID}} on {{.Device}}: {{.Status}} ({{.Why}})</h3>{{.SVG}}</div>
{{else}}<p>none</p>{{end}}
</body></html>
`))
