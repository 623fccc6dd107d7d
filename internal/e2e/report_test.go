package e2e

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/report"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// reportDirEnv names a directory where every test that runs a system
// (setup) leaves the HTML report of its run when it ends: scenarios/run
// sets it and stitches the pieces into one page.
const reportDirEnv = "SCENARIO_REPORT_DIR"

var (
	reportMu    sync.Mutex
	reportNames = map[string]int{}
)

// writeReport writes the report of b's run into dir: <test>.html, the
// inside of the report's <body> (a fragment to put in a larger page), and
// report.css, its style sheet. A report that cannot be made becomes a
// fragment saying why; a failed test's report is as useful as any.
func (b *bundle) writeReport(dir string) {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(b.t.Name())
	reportMu.Lock()
	reportNames[name]++
	if n := reportNames[name]; n > 1 {
		name = fmt.Sprintf("%s-%d", name, n)
	}
	reportMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var page bytes.Buffer
	err := report.Write(ctx, &page, report.Config{DB: b.db, StateDir: b.stateDir, Title: b.t.Name()})
	style, body := splitReport(page.String())
	if err != nil {
		body = fmt.Sprintf("<h1>%s</h1><p class=\"fail\">no report: %s</p>", html.EscapeString(b.t.Name()), html.EscapeString(err.Error()))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Errorf("report dir: %v", err)
		return
	}
	if style != "" {
		if err := os.WriteFile(filepath.Join(dir, "report.css"), []byte(style), 0o644); err != nil {
			b.t.Errorf("report style: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, name+".html"), []byte(body), 0o644); err != nil {
		b.t.Errorf("report: %v", err)
	}
}

// splitReport takes a report page apart: the content of its <style> and
// the inside of its <body>. A page without a body is kept whole, framed.
func splitReport(page string) (style, body string) {
	if i := strings.Index(page, "<style>"); i >= 0 {
		if j := strings.Index(page[i:], "</style>"); j >= 0 {
			style = page[i+len("<style>") : i+j]
		}
	}
	i := strings.Index(page, "<body")
	j := strings.LastIndex(page, "</body>")
	if i < 0 || j < i || !strings.Contains(page[i:], ">") {
		return style, `<iframe style="width:100%;height:1400px;border:0" srcdoc="` + html.EscapeString(page) + `"></iframe>`
	}
	i += strings.Index(page[i:], ">") + 1
	return style, page[i:j]
}

const chromium = "/usr/bin/chromium"

// TestReportRendersInChromium writes the HTML report of a run with a lost
// response (receipts dropped, the controller asks) and a lost command (a
// re-send), renders it in headless Chromium and checks the screenshot shows
// the report: not blank, with the timelines' colours.
func TestReportRendersInChromium(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("chromium is not installed at %s: run 'make deps' (apt-get install chromium)", chromium)
	}
	b := setup(t, setupOpts{faults: sim.Profile{Devices: []sim.Override{
		{Match: "device-1", Faults: sim.Faults{DropReceipt: sim.ReceiptFault{Trigger: sim.Trigger{Count: 3}}}},
		{Match: "device-2", Faults: sim.Faults{DropCommand: sim.Trigger{Count: 1}}},
	}}})
	for _, d := range []string{"device-1", "device-2", "device-3"} {
		op, _, err := b.client.Submit(b.ctx(), req("report", d), "")
		require.NoError(t, err)
		require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	}
	dir := t.TempDir()
	html := filepath.Join(dir, "report.html")
	out, err := exec.Command(testenv.Binary(t, "controller"), "report", "--db", b.db, "--state-dir", b.stateDir, "--out", html).CombinedOutput()
	require.NoError(t, err, "%s", out)
	body, err := os.ReadFile(html)
	require.NoError(t, err)
	require.Contains(t, string(body), "<svg")
	require.Contains(t, string(body), "query")
	require.Contains(t, string(body), "re-send")
	require.Equal(t, 8, strings.Count(string(body), `class="pass"`), "invariants 1-7 and 10, all passing")

	shot := filepath.Join(dir, "report.png")
	cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--user-data-dir="+filepath.Join(dir, "profile"),
		"--window-size=1280,1400", "--screenshot="+shot, "file://"+html)
	cmd.Env = append(os.Environ(), "TMPDIR="+chromiumTmp(t))
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	f, err := os.Open(shot)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	bounds := img.Bounds()
	nonWhite, coloured := 0, 0
	for y := bounds.Min.Y; y < bounds.Max.Y; y += 2 {
		for x := bounds.Min.X; x < bounds.Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r < 0xf000 || g < 0xf000 || bl < 0xf000 {
				nonWhite++
			}
			if max(r, g, bl)-min(r, g, bl) > 0x4000 { // a saturated colour: the timelines' marks
				coloured++
			}
		}
	}
	total := (bounds.Dx() / 2) * (bounds.Dy() / 2)
	t.Logf("report screenshot %dx%d: %.1f%% non-white, %d coloured samples", bounds.Dx(), bounds.Dy(), 100*float64(nonWhite)/float64(total), coloured)
	require.Greater(t, float64(nonWhite)/float64(total), 0.01, "the screenshot is not blank")
	require.Greater(t, coloured, 50, "the timelines are drawn")
}

// chromiumTmp is a TMPDIR for Chromium, which keeps its singleton socket
// in TMPDIR/org.chromium.Chromium.XXXXXX/SingletonSocket and aborts when
// that path is longer than a Unix socket's 107 bytes: the test's own TMPDIR
// when it is short enough, otherwise a new directory under /tmp, removed
// when the test ends.
func chromiumTmp(t *testing.T) string {
	dir := os.TempDir()
	if len(dir)+len("/org.chromium.Chromium.XXXXXX/SingletonSocket") < 100 {
		return dir
	}
	dir, err := os.MkdirTemp("/tmp", "chromium")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestSplitReport(t *testing.T) {
	t.Parallel()
	style, body := splitReport("<html><head><style>h1{x:y}</style></head><body class=\"r\">\n<h1>a</h1></body></html>")
	require.Equal(t, "h1{x:y}", style)
	require.Equal(t, "\n<h1>a</h1>", body)
	style, body = splitReport("<p>no body & more</p>")
	require.Empty(t, style)
	require.Equal(t, `<iframe style="width:100%;height:1400px;border:0" srcdoc="&lt;p&gt;no body &amp; more&lt;/p&gt;"></iframe>`, body)
}
