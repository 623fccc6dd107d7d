package report

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/clock"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/wire"
	"github.com/fleetctl/fleetctl/internal/witness"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func TestDrawEmpty(t *testing.T) {
	t.Parallel()
	svg := string(draw(nil))
	require.True(t, strings.HasPrefix(svg, `<svg xmlns="http://www.w3.org/2000/svg" width="1100" height="372"`), svg)
	require.True(t, strings.HasSuffix(svg, `</svg>`))
	for _, lane := range lanes {
		require.Contains(t, svg, ">"+lane+"</text>")
	}
	for _, shape := range []string{"<circle", "<rect", "<polygon", "<title>"} {
		require.NotContains(t, svg, shape)
	}
}

// TestDraw: each mark is drawn with its shape and colour on its lane, at
// its time along the axis (the first at the left end, the last at the right
// end), its label escaped; the axis shows the span; labels near the right
// edge end at their mark; labels crowded on one lane are staggered.
func TestDraw(t *testing.T) {
	t.Parallel()
	ms := []mark{
		{At: t0, Lane: 0, Label: "sent", Color: "#2563eb", Shape: "circle"},
		{At: t0.Add(500 * time.Millisecond), Lane: 1, Label: "query → <none> & more", Color: "#7c3aed", Shape: "triangle"},
		{At: t0.Add(510 * time.Millisecond), Lane: 1, Label: "query 2", Color: "#7c3aed", Shape: "triangle"},
		{At: t0.Add(1500 * time.Millisecond), Lane: 2, Label: "succeeded (applied)", Color: "#16a34a", Shape: "square"},
	}
	svg := string(draw(ms))
	// Lane centres: 30 + 52*lane + 26.
	require.Contains(t, svg, `<circle cx="180.0" cy="56.0" r="6" fill="#2563eb"/>`, "the first mark at the left end of lane 0")
	require.Contains(t, svg, `<rect x="1065.0" y="155.0" width="10" height="10" fill="#16a34a"/>`, "the last at the right end of lane 2")
	require.Contains(t, svg, `<polygon points="476.7,102.0 470.7,113.0 482.7,113.0" fill="#7c3aed"/>`, "a third of the way, lane 1")
	require.Contains(t, svg, `>1.5s</text>`, "the axis shows the span")
	require.Equal(t, 4, strings.Count(svg, "<title>"))

	// Escaped, never raw.
	require.Contains(t, svg, "query → &lt;none&gt; &amp; more</text>")
	require.NotContains(t, svg, "<none>")
	require.Contains(t, svg, "<title>10:00:00.500 query → &lt;none&gt; &amp; more</title>", "the tooltip has the time")

	// The last label ends at its mark; the others start at theirs.
	require.Regexp(t, `<text x="1063.0" y="[0-9.]+" fill="#111827" text-anchor="end"><title>[^<]*</title>succeeded \(applied\)</text>`, svg)
	require.Regexp(t, `<text x="187.0" y="48.0" fill="#111827" text-anchor="start"><title>[^<]*</title>sent</text>`, svg)

	// Two labels 3 px apart on lane 1: the second one row higher.
	y := func(label string) string {
		m := regexp.MustCompile(`<text x="[0-9.]+" y="([0-9.]+)"[^>]*><title>[^<]*</title>` + regexp.QuoteMeta(label) + `</text>`).FindStringSubmatch(svg)
		require.NotNil(t, m, label)
		return m[1]
	}
	require.Equal(t, "100.0", y("query → &lt;none&gt; &amp; more"))
	require.Equal(t, "90.0", y("query 2"))
}

// TestDrawOneInstant: marks all at one time are drawn, not divided by zero.
func TestDrawOneInstant(t *testing.T) {
	t.Parallel()
	svg := string(draw([]mark{{At: t0, Lane: 5, Label: "online (birth)", Color: "#16a34a", Shape: "triangle"}}))
	require.Contains(t, svg, `<polygon points="180.0,310.0 174.0,321.0 186.0,321.0" fill="#16a34a"/>`)
	require.Contains(t, svg, `>1ms</text>`)
	require.NotContains(t, svg, "NaN")
}

// TestWrite renders a run's database and state dir: the title, the
// verdicts, the counts by state and effect, and the timeline of its
// command with the controller's decisions, the receipt as received, and
// the device's witness lines.
func TestWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "c.db")
	clk := clock.NewFake(t0)
	s, err := backend.Open(ctx, store.Config{Path: db, Instance: "i1", Now: clk.Now})
	require.NoError(t, err)
	_, err = s.Submit(ctx, store.NewOperation{OperationID: "op-1", Action: "restart", Target: "device-1",
		Params: json.RawMessage(`{}`), RequestHash: "h1", CommandID: "c-1", CommandTTL: time.Hour, QoS: 1,
		Owner: "i1", LeaseTTL: 10 * time.Second}, nil)
	require.NoError(t, err)
	_, err = s.Submit(ctx, store.NewOperation{OperationID: "op-2", Action: "restart", Target: "device-2",
		Params: json.RawMessage(`{}`), RequestHash: "h2", CommandID: "c-2", CommandTTL: time.Hour, QoS: 1,
		Owner: "i1", LeaseTTL: 10 * time.Second}, nil)
	require.NoError(t, err)
	clk.Advance(20 * time.Millisecond)
	_, err = s.ClaimSend(ctx, "c-1", fsm.CmdPending, 0, 1, domain.Fence{Owner: "i1", Token: 1}, clk.Now().Add(time.Second))
	require.NoError(t, err)
	clk.Advance(30 * time.Millisecond)
	sent := clk.Now()
	_, err = s.ApplyReceipt(ctx, "device-1", wire.Receipt{CommandID: "c-1", OperationID: "op-1", Status: wire.ReceiptSucceeded,
		Seq: 1, At: sent, Result: json.RawMessage(`{}`)}, nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	state := t.TempDir()
	w, err := witness.Open(state)
	require.NoError(t, err)
	require.NoError(t, w.Execution(witness.Execution{DeviceID: "device-1", CommandID: "c-1", OperationID: "op-1",
		Action: "restart", At: sent.Add(-5 * time.Millisecond)}))
	require.NoError(t, w.Receipt(witness.PublishedReceipt{DeviceID: "device-1", CommandID: "c-1", OperationID: "op-1",
		Status: wire.ReceiptSucceeded, Seq: 1, At: sent}))
	require.NoError(t, w.Close())

	var b strings.Builder
	require.NoError(t, Write(ctx, &b, Config{DB: db, StateDir: state, Title: "night <run> & co"}))
	html := b.String()
	require.Contains(t, html, "<title>night &lt;run&gt; &amp; co</title>")
	require.Contains(t, html, "<h1>night &lt;run&gt; &amp; co</h1>")
	require.NotContains(t, html, "<run>")

	passes, fails := strings.Count(html, `class="pass">PASS`), strings.Count(html, `class="fail">FAIL`)
	require.Positive(t, passes+fails, "one row per invariant")
	require.Equal(t, passes+fails, strings.Count(html, "<tr><td>")-countRows(html), "every invariant row has a verdict")

	require.Contains(t, html, "<h2>Operations</h2><table><tr><td>started</td><td>1</td></tr><tr><td>succeeded</td><td>1</td></tr></table>")
	require.Contains(t, html, "<tr><td>succeeded</td><td>1</td></tr>")
	require.Contains(t, html, "<tr><td>pending</td><td>1</td></tr>")
	require.Contains(t, html, "<h2>Receipts by effect</h2><table><tr><td>applied</td><td>1</td></tr></table>")

	// Both commands are drawn (Max 12), each with its heading.
	require.Contains(t, html, "<h3>c-1 — op-1 on device-1: succeeded (1 publishes, 0 queries)</h3><svg")
	require.Contains(t, html, "<h3>c-2 — op-2 on device-2: pending (0 publishes, 0 queries)</h3><svg")
	c1 := html[strings.Index(html, "<h3>c-1"):]
	c1 = c1[:strings.Index(c1, "</svg>")]
	for _, label := range []string{">sent</text>", ">succeeded</text>", ">succeeded (applied)</text>",
		">published succeeded</text>", ">executed restart</text>"} {
		require.Contains(t, c1, label)
	}

	// Max bounds the timelines.
	b.Reset()
	require.NoError(t, Write(ctx, &b, Config{DB: db, Max: 1}))
	require.Equal(t, 1, strings.Count(b.String(), `<div class="tl">`))
	require.Contains(t, b.String(), "<title>fleetctl run report</title>", "the default title")
}

// countRows counts the count tables' rows (name, number), which are not
// verdicts.
func countRows(html string) int {
	return len(regexp.MustCompile(`<tr><td>[a-z_]+</td><td>[0-9]+</td></tr>`).FindAllString(html, -1))
}

func TestWriteEmptyRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "c.db")
	s, err := backend.Open(ctx, store.Config{Path: db, Instance: "i1"})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	var b strings.Builder
	require.NoError(t, Write(ctx, &b, Config{DB: db}))
	require.Contains(t, b.String(), "<h2>Commands of interest</h2>\n<p>none</p>")
}

func TestWriteMissingDatabase(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	err := Write(context.Background(), &b, Config{DB: filepath.Join(t.TempDir(), "nope.db")})
	require.Error(t, err)
	require.Empty(t, b.String(), "nothing written")
}
