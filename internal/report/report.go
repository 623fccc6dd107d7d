// Package report writes one self-contained HTML file for a run: the
// invariant verdicts, counts by state, and for each command of interest a
// timeline drawn as SVG (publishes, queries, re-sends, receipts as the
// controller got them and as the device published them, executions, presence
// changes, the final state), so a person sees the failure window and how it
// closed.
package report

import (
	"context"
	"database/sql"
	"fmt"
	"html/template"
	"io"
	"sort"
	"strings"
	"time"

	_ "github.com/mattn/go-sqlite3" // the sqlite3 driver

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
	db, err := sql.Open("sqlite3", "file:"+cfg.DB+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		return err
	}
	defer db.Close()
	vs, err := verify.Run(ctx, verify.Config{DB: cfg.DB, StateDir: cfg.StateDir, Slack: time.Minute})
	if err != nil {
		return err
	}
	p := page{Title: cfg.Title, Generated: time.Now().UTC().Format(time.RFC3339), Verdicts: vs}
	if p.Title == "" {
		p.Title = "fleetctl run report"
	}
	for _, q := range []struct {
		dst *[]countRow
		sql string
	}{
		{&p.Operations, `SELECT status, COUNT(*) FROM operations GROUP BY 1 ORDER BY 1`},
		{&p.Commands, `SELECT status, COUNT(*) FROM commands GROUP BY 1 ORDER BY 1`},
		{&p.Effects, `SELECT effect, COUNT(*) FROM receipts GROUP BY 1 ORDER BY 1`},
	} {
		rows, err := db.QueryContext(ctx, q.sql)
		if err != nil {
			return err
		}
		for rows.Next() {
			var r countRow
			if err := rows.Scan(&r.Name, &r.N); err != nil {
				rows.Close()
				return err
			}
			*q.dst = append(*q.dst, r)
		}
		rows.Close()
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
	rows, err := db.QueryContext(ctx, `SELECT c.command_id, c.operation_id, c.device_id, c.status,
		(c.attempt > 1) * 3 + (c.queries > 0) * 2 + (c.late_outcome != '') * 4 + (c.status IN ('timeout','needs_attention','failed','cancelled')) * 3
		 + (c.executed_as != '') * 2 + (SELECT COUNT(*) FROM events e WHERE e.entity_id = c.command_id AND e.refused = 1) * 2 AS score,
		c.attempt, c.queries, c.late_outcome
		FROM commands c ORDER BY score DESC, c.created_at LIMIT ?`, cfg.Max)
	if err != nil {
		return err
	}
	type pick struct {
		id, op, dev, status, late string
		attempt, queries          int
	}
	var picks []pick
	for rows.Next() {
		var k pick
		var score int
		if err := rows.Scan(&k.id, &k.op, &k.dev, &k.status, &score, &k.attempt, &k.queries, &k.late); err != nil {
			rows.Close()
			return err
		}
		picks = append(picks, k)
	}
	rows.Close()
	for _, k := range picks {
		marks, err := commandMarks(ctx, db, k.id, k.dev, execs, pubs)
		if err != nil {
			return err
		}
		why := fmt.Sprintf("%d publishes, %d queries", k.attempt, k.queries)
		if k.late != "" {
			why += ", late outcome " + k.late
		}
		p.Timelines = append(p.Timelines, timeline{CommandID: k.id, OperationID: k.op, Device: k.dev, Status: k.status,
			Why: why, SVG: draw(marks)})
	}
	return pageTmpl.Execute(w, p)
}

func commandMarks(ctx context.Context, db *sql.DB, id, device string, execs []witness.Execution, pubs []witness.PublishedReceipt) ([]mark, error) {
	var ms []mark
	add := func(q string, f func(sc func(...any) error) (mark, error), args ...any) error {
		rows, err := db.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			m, err := f(rows.Scan)
			if err != nil {
				return err
			}
			ms = append(ms, m)
		}
		return rows.Err()
	}
	err := add(`SELECT at, from_state, to_state, reason, refused FROM events WHERE entity_id = ? ORDER BY id`, func(sc func(...any) error) (mark, error) {
		var at int64
		var from, to, reason string
		var refused bool
		err := sc(&at, &from, &to, &reason, &refused)
		label, color := to, "#2563eb"
		if from == to {
			label = reason
		}
		if strings.HasPrefix(reason, "publish attempt") && from == to {
			label, color = "re-send "+strings.TrimPrefix(reason, "publish "), "#d97706"
		}
		if refused {
			label, color = "refused "+to+" ("+reason+")", "#dc2626"
		}
		switch to {
		case "succeeded":
			color = "#16a34a"
		case "failed", "timeout", "needs_attention", "cancelled":
			color = "#dc2626"
		}
		return mark{At: time.UnixMilli(at), Lane: 0, Label: label, Color: color, Shape: "circle"}, err
	}, id)
	if err != nil {
		return nil, err
	}
	if err := add(`SELECT sent_at, answered_at, answer FROM queries WHERE command_id = ? ORDER BY sent_at`, func(sc func(...any) error) (mark, error) {
		var sent int64
		var answered sql.NullInt64
		var answer string
		err := sc(&sent, &answered, &answer)
		label := "query"
		if answered.Valid {
			label += " → " + answer
		} else {
			label += " (no answer)"
		}
		return mark{At: time.UnixMilli(sent), Lane: 1, Label: label, Color: "#7c3aed", Shape: "triangle"}, err
	}, id); err != nil {
		return nil, err
	}
	if err := add(`SELECT received_at, status, effect, query_id FROM receipts WHERE command_id = ? ORDER BY id`, func(sc func(...any) error) (mark, error) {
		var at int64
		var status, effect, qid string
		err := sc(&at, &status, &effect, &qid)
		color := "#16a34a"
		if effect != "applied" {
			color = "#9ca3af"
		}
		label := status + " (" + effect + ")"
		if qid != "" {
			label += " answer"
		}
		return mark{At: time.UnixMilli(at), Lane: 2, Label: label, Color: color, Shape: "square"}, err
	}, id); err != nil {
		return nil, err
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
		if err := add(`SELECT at, to_state, reason FROM events WHERE machine = 'device' AND entity_id = ? AND at BETWEEN ? AND ? ORDER BY id`,
			func(sc func(...any) error) (mark, error) {
				var at int64
				var to, reason string
				err := sc(&at, &to, &reason)
				color := "#16a34a"
				if to == "offline" {
					color = "#dc2626"
				}
				return mark{At: time.UnixMilli(at), Lane: 5, Label: to + " (" + reason + ")", Color: color, Shape: "triangle"}, err
			}, device, lo.UnixMilli()-500, hi.UnixMilli()+500); err != nil {
			return nil, err
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
