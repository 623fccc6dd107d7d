package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/api"
	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/events"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
	"github.com/fleetctl/fleetctl/internal/testenv"
	"github.com/fleetctl/fleetctl/internal/ui"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// screenshotsEnv names a directory to keep the dashboard's screenshots in;
// without it they go to the test's artifact directory (kept by go test
// -artifacts -outputdir DIR).
const screenshotsEnv = "FLEETCTL_SCREENSHOTS"

// chrome is a headless Chromium from Debian's package, driven over the
// DevTools protocol with chromedp: a process of the test's own (killed with
// its children when the test ends, or the test process is interrupted),
// with a fresh profile in a directory removed afterwards.
type chrome struct {
	t    *testing.T
	ctx  context.Context
	shot string // where screenshots go
	mu   sync.Mutex
	logs []string // console messages and exceptions of the page
}

func startChrome(t *testing.T) *chrome {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("chromium is not installed at %s: run 'make deps' (apt-get install chromium)", chromium)
	}
	profile := filepath.Join(t.TempDir(), "profile")
	cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+profile, "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		"--window-size=1280,860", "about:blank")
	// Its own TMPDIR (its singleton socket lives there), removed after it
	// is gone: a short path, as a socket's has at most 107 bytes.
	tmp, err := os.MkdirTemp(chromiumTmp(t), "cr")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	// Its own process group, so that its helpers (zygote, renderers) go
	// with it; and it dies with the test process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	testenv.StartProcess(t, cmd)
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		// After the browser's own close (below): whatever of its group is
		// left is killed; then StartProcess's cleanup reaps it.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	})

	// Chromium writes its DevTools port and path to DevToolsActivePort.
	var ws string
	eventually(t, "Chromium's DevToolsActivePort", 30*time.Second, func() bool {
		raw, err := os.ReadFile(filepath.Join(profile, "DevToolsActivePort"))
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if err != nil || len(lines) != 2 {
			return false
		}
		ws = "ws://127.0.0.1:" + lines[0] + lines[1]
		return true
	})
	actx, cancelAlloc := remote.NewAllocator(context.Background(), ws, remote.NoModifyURL)
	ctx, cancel := chromedp.NewContext(actx)
	c := &chrome{t: t, ctx: ctx, shot: os.Getenv(screenshotsEnv)}
	if c.shot == "" {
		c.shot = t.ArtifactDir()
	}
	require.NoError(t, os.MkdirAll(c.shot, 0o755))
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1280, 860)), "%s", out.String())
	go func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			c.mu.Lock()
			c.logs = append(c.logs, m.String())
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		// Close the browser, and wait (bounded) for its process to go.
		closing, done := context.WithTimeout(ctx, 5*time.Second)
		_, _ = chromedp.CallBrowser(closing, browser.Close, cdp.Empty{})
		done()
		cancel()
		cancelAlloc()
		deadline := time.Now().Add(10 * time.Second)
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			<-time.After(20 * time.Millisecond) // poll interval of a deadline-bounded wait
		}
	})
	return c
}

// do runs actions with a deadline, failing the test with the page's console.
func (c *chrome) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		c.t.Fatalf("%s: %v\npage console:\n%s", what, err, c.console())
	}
}

// wait waits for a JavaScript condition to hold, with a deadline.
func (c *chrome) wait(what, expr string, timeout time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, timeout+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(timeout))); err != nil {
		c.t.Fatalf("waiting for %s (%s): %v\npage console:\n%s", what, expr, err, c.console())
	}
}

func (c *chrome) eval(expr string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	require.NoError(c.t, err, "%s", expr)
	return v
}

// screenshot writes the whole page as name.png.
func (c *chrome) screenshot(name string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(c.t, err)
	path := filepath.Join(c.shot, name+".png")
	require.NoError(c.t, os.WriteFile(path, png, 0o644))
	c.t.Logf("screenshot %s (%d KiB)", path, len(png)>>10)
	return path
}

func (c *chrome) console() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.logs, "\n")
}

// exceptions are the uncaught errors the page threw.
func (c *chrome) exceptions() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.logs {
		if strings.Contains(l, "Uncaught") || strings.HasPrefix(l, "exception") {
			out = append(out, l)
		}
	}
	return out
}

// q quotes a string for JavaScript.
func q(s string) string { return strconv.Quote(s) }

// TestDashboardInChromium drives the dashboard of a controller with tokens
// (restart needs approval) in headless Chromium: alice (an approver) signs
// in; the fleet page lists the simulated devices; a command submitted
// through the API appears on the commands page and moves to succeeded with
// no reload, and its timeline shows its receipts; a task waits for approval,
// alice approves it by clicking (twice), and its step runs once on the
// device; the rollouts page copes with a controller without rollout routes.
// A screenshot of each page is written.
func TestDashboardInChromium(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	c := startChrome(t)
	ui := tb.ctl.URL + "/ui/"

	// Sign in: the API has --tokens, so the page asks for one.
	c.do("open the dashboard", chromedp.Navigate(ui), chromedp.WaitVisible(chromedp.CSS("#login-form")))
	c.screenshot("login")
	c.do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), "t-alice"), chromedp.Click(chromedp.CSS("#login-form button")))
	c.wait("signed in as alice", `document.getElementById("who").dataset.principal === "alice"`, 10*time.Second)
	c.wait("the event stream is live", `document.getElementById("live").dataset.state === "live"`, 10*time.Second)
	c.eval(`window.__loaded = "once"; "ok"`) // a reload would forget it

	// The fleet: every simulated device, online, with its session.
	for _, d := range tb.fleet.Devices() {
		sel := fmt.Sprintf(`#fleet tbody tr[data-id=%s][data-online="true"]`, q(d.ID()))
		c.wait("device "+d.ID()+" listed online", fmt.Sprintf(`document.querySelector(%s) !== null`, q(sel)), 15*time.Second)
		session := c.eval(fmt.Sprintf(`document.querySelector(%s).children[3].textContent`, q(sel)))
		require.Equal(t, strconv.FormatInt(d.Session(), 10), session, d.ID())
	}
	c.wait("the fleet's counts", `document.getElementById("fleet-total").textContent === "3" && document.getElementById("fleet-online").textContent === "3"`, 10*time.Second)
	c.screenshot("fleet")

	// Commands: one submitted through the API appears and moves to
	// succeeded on the open page.
	c.do("open commands", chromedp.Click(chromedp.CSS(`#nav a[data-view="commands"]`)), chromedp.WaitVisible(chromedp.CSS("#commands")))
	var op apiwire.Operation
	status, err := tb.agent.Do(tb.ctx(), http.MethodPost, "/v1/operations", nil, apiwire.SubmitRequest{TaskID: "ui", Step: "configure",
		Target: "device-1", BusinessVersion: "v1", Action: "set-config", Params: []byte(`{"fw":"4.2"}`)}, &op)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	row := fmt.Sprintf(`#commands tbody tr[data-id=%s]`, q(op.CommandID))
	c.wait("the command on the page", fmt.Sprintf(`document.querySelector(%s) !== null`, q(row)), 15*time.Second)
	c.wait("the command succeeded on the page", fmt.Sprintf(`document.querySelector(%s).dataset.status === "succeeded"`, q(row+`[data-status]`)), 30*time.Second)
	c.wait("its operation and device filled in", fmt.Sprintf(`document.querySelector(%s).children[1].textContent === %s`, q(row), q(op.OperationID)), 10*time.Second)
	require.Equal(t, "once", c.eval(`window.__loaded`), "the page was not reloaded")
	require.Equal(t, "succeeded", tb.waitFinal(op.OperationID).Status)
	c.screenshot("commands")

	// Its timeline: the events and the three receipts, applied.
	c.do("open the command", chromedp.Click(chromedp.CSS(row+" a")), chromedp.WaitVisible(chromedp.CSS("#timeline")))
	c.wait("the timeline's receipts", `document.querySelectorAll('#timeline li.receipt[data-effect="applied"]').length === 3 && `+
		`document.querySelector('#timeline li.event[data-to="succeeded"]') !== null`, 15*time.Second)
	c.screenshot("command")

	// Approvals: the agent's task waits; alice approves it from the page.
	_, status, err = tb.agent.CreateTask(tb.ctx(), apiwire.TaskRequest{TaskID: "task-ui", Steps: stepsOf("device-1001")})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	c.do("open approvals", chromedp.Click(chromedp.CSS(`#nav a[data-view="approvals"]`)), chromedp.WaitVisible(chromedp.CSS("#approvals")))
	card := `#waiting article.task[data-id="task-ui"]`
	c.wait("the task waiting, approve offered", fmt.Sprintf(`(b => b !== null && !b.disabled)(document.querySelector(%s))`, q(card+" button.approve")), 15*time.Second)
	require.Equal(t, "1", c.eval(`document.getElementById("waiting-badge").textContent`))
	c.screenshot("approvals")
	c.do("approve (a double click)", chromedp.DoubleClick(chromedp.CSS(card+" button.approve")))
	c.wait("the task completed, live", `(r => r !== null && r.dataset.status === "completed")(document.querySelector('#task-changes tr[data-id="task-ui"]'))`, 30*time.Second)
	c.wait("nothing waits any more", `document.querySelector('#waiting article.task') === null && document.getElementById("waiting-total").textContent === "0"`, 10*time.Second)
	done := tb.waitTask("task-ui", "completed")
	require.Equal(t, "alice", done.Approval.Approver)
	const stepOp = "task-ui:restart-device:device-1001:approval-v1"
	require.Equal(t, stepOp, *done.Steps[0].OperationID)
	require.Equal(t, 1, tb.executions()[stepOp], "the step ran once on the device")
	approvals := 0
	for _, h := range done.History {
		if h.Action == "approve" {
			approvals++
		}
	}
	require.Equal(t, 1, approvals, "one approval in the history")
	c.screenshot("approvals-done")

	// A rejection with a reason: the task ends rejected, nothing runs.
	_, status, err = tb.agent.CreateTask(tb.ctx(), apiwire.TaskRequest{TaskID: "task-no", Steps: stepsOf("device-2")})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	no := `#waiting article.task[data-id="task-no"]`
	c.wait("the second task waiting", fmt.Sprintf(`document.querySelector(%s) !== null`, q(no+" button.reject")), 15*time.Second)
	c.do("reject it", chromedp.SendKeys(chromedp.CSS(no+" input.reason"), "not during the sale"), chromedp.Click(chromedp.CSS(no+" button.reject")))
	c.wait("rejected, live", `(r => r !== null && r.dataset.status === "rejected")(document.querySelector('#task-changes tr[data-id="task-no"]'))`, 15*time.Second)
	rejected := tb.task("task-no")
	require.Equal(t, "rejected", rejected.Status)
	require.Contains(t, rejected.Reason, "not during the sale")
	require.Nil(t, rejected.Steps[0].OperationID, "no step ran")

	// Rollouts: without rollout routes the page says so and goes on.
	c.do("open rollouts", chromedp.Click(chromedp.CSS(`#nav a[data-view="rollouts"]`)), chromedp.WaitVisible(chromedp.CSS("#rollouts")))
	c.wait("the rollouts page settled", `document.getElementById("rollouts-note").textContent !== ""`, 10*time.Second)
	c.screenshot("rollouts")

	require.Equal(t, "once", c.eval(`window.__loaded`), "no page reload all along")
	t.Logf("the page saw %s events", c.eval(`document.getElementById("live").dataset.events`))

	// Sign out; a wrong token is refused; a reader without the approver
	// role sees a waiting task with approve and reject off.
	_, status, err = tb.agent.CreateTask(tb.ctx(), apiwire.TaskRequest{TaskID: "task-wait", Steps: stepsOf("device-1")})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	c.do("sign out", chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#login-form")))
	c.do("a wrong token", chromedp.SendKeys(chromedp.CSS("#token"), "t-nobody"), chromedp.Click(chromedp.CSS("#login-form button")))
	c.wait("refused", `document.getElementById("login-error").textContent === "that token is not valid"`, 10*time.Second)
	c.eval(`location.hash = "#/approvals"; "ok"`)
	c.do("the viewer's token", chromedp.SendKeys(chromedp.CSS("#token"), "t-viewer"), chromedp.Click(chromedp.CSS("#login-form button")))
	wait := `#waiting article.task[data-id="task-wait"]`
	c.wait("the viewer sees the task, buttons off", fmt.Sprintf(`(a => a !== null && a.querySelector("button.approve").disabled && a.querySelector("button.reject").disabled)(document.querySelector(%s))`, q(wait)), 15*time.Second)
	require.Equal(t, "viewer", c.eval(`document.getElementById("who").dataset.principal`))
	c.screenshot("approvals-viewer")
	require.Empty(t, c.exceptions(), "the page threw")
	t.Logf("screenshots in %s", c.shot)
}

func stepsOf(target string) []apiwire.Step {
	return []apiwire.Step{{Step: "restart-device", Action: "restart", Target: target, Params: []byte(`{"reason":"stuck"}`)}}
}

// feed is the store's feed in an in-process server: each committed
// change goes to the bus, as the controller's route sends it.
type feed struct{ bus *events.Bus }

func (f feed) Publish(x store.Fact) {
	if x.Kind == store.FactChanged {
		f.bus.Changed(x.Change)
	}
}

// fakeRollout answers GET /v1/rollouts and /v1/rollouts/{id} with one
// rollout in the API's shape, as the test sets it.
type fakeRollout struct {
	mu sync.Mutex
	v  map[string]any
}

func (f *fakeRollout) set(v map[string]any) { f.mu.Lock(); f.v = v; f.mu.Unlock() }

func (f *fakeRollout) serve(list bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		v := f.v
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if list {
			w.Header().Set("X-Total-Count", "1")
			_ = json.NewEncoder(w).Encode([]any{v})
			return
		}
		if r.PathValue("id") != v["rollout_id"] {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":"not_found","message":"no rollout"}`))
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	}
}

func rolloutShape(status, reason string, counts map[string]int, tripped bool) map[string]any {
	finished, outcomes := 0, 0 // with the cancelled, and without
	for k, n := range counts {
		if k != "pending" && k != "started" && k != "retry" {
			finished += n
			if k != "cancelled" {
				outcomes += n
			}
		}
	}
	share := 100 * float64(counts["failed"]) / float64(max(outcomes, 1))
	return map[string]any{
		"rollout_id": "fw-42", "status": status, "reason": reason, "version": 1, "action": "set-config",
		"params": map[string]any{"fw": "4.2"}, "devices": "device-*", "devices_total": 10000,
		"max_per_minute": 600, "max_in_flight": 100,
		"ramp":   map[string]any{"base_per_minute": 60, "factor": 2, "every_succeeded": 50},
		"abort":  []any{map[string]any{"when": "failed", "percent": 5, "min_finished": 20}},
		"counts": counts, "finished": finished, "in_flight": counts["started"],
		"rate": map[string]any{"allowed_per_minute": 600, "interval_ms": 100, "starts_last_minute": 587, "starts": 4450},
		"abort_state": []any{map[string]any{"when": "failed", "percent": 5, "min_finished": 20, "finished": outcomes,
			"matching": counts["failed"], "share_percent": share, "tripped": tripped}},
		"window": map[string]any{"open": true}, "created_by": "alice", "created_at": time.Now().Add(-8 * time.Minute),
		"history": []any{
			map[string]any{"at": time.Now().Add(-8 * time.Minute), "principal": "alice", "action": "create", "from": "", "to": "scheduled"},
			map[string]any{"at": time.Now().Add(-8 * time.Minute), "principal": "i1", "action": "run", "from": "scheduled", "to": "running"},
		},
	}
}

// TestDashboardPagesTenThousandDevicesAndShowsRollouts: the dashboard of an
// API over a real store with 10,000 devices, in headless Chromium: the
// fleet page reads one page at a time (the counts from X-Total-Count, Next
// through the Link header, another page size), a device that goes offline
// changes its row and the counts live; the rollouts page shows a rollout's
// progress, rate and abort rules from the API's shape, and its abort
// arrives live. (Rollout routes of the test's own, in the API's shape.)
func TestDashboardPagesTenThousandDevicesAndShowsRollouts(t *testing.T) {
	t.Parallel()
	const n = 10000
	bus := events.New(events.Config{})
	st, err := backend.Open(context.Background(), store.Config{Path: filepath.Join(t.TempDir(), "c.db"), Instance: "i1", Feed: feed{bus}})
	require.NoError(t, err)
	defer st.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for w := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w + 1; i <= n; i += 50 {
				skew := time.Duration(i%7-3) * 40 * time.Millisecond
				at := time.Now().Add(skew)
				if _, err := st.ApplyPresence(context.Background(), fmt.Sprintf("device-%05d", i),
					wire.Presence{Online: true, Session: int64(i%5 + 1), At: &at, Capabilities: &wire.Capabilities{Dedupe: true, Query: i%3 != 0}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	fake := &fakeRollout{}
	fake.set(rolloutShape("running", "", map[string]int{"succeeded": 4200, "failed": 150, "started": 100, "pending": 5550}, false))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/rollouts", fake.serve(true))
	mux.HandleFunc("GET /v1/rollouts/{id}", fake.serve(false))
	mux.Handle("/", api.New(api.Config{Store: st, Instance: "i1", Events: bus, UI: ui.Handler(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer bus.Close()

	c := startChrome(t)
	c.do("open the fleet", chromedp.Navigate(srv.URL+"/ui/#/fleet"), chromedp.WaitVisible(chromedp.CSS("#fleet")))
	rows := `document.querySelectorAll("#fleet tbody tr[data-id]")`
	first := rows + `[0].dataset.id`
	c.wait("the first page of 10,000", `document.getElementById("fleet-total").textContent === "10,000" && `+
		`document.getElementById("fleet-online").textContent === "10,000" && `+rows+`.length === 100 && `+first+` === "device-00001"`, 20*time.Second)
	c.eval(`window.__loaded = "once"; "ok"`)
	c.screenshot("fleet-10000")
	c.do("next page", chromedp.Click(chromedp.CSS("#fleet-next")))
	c.wait("the second page", first+` === "device-00101" && document.getElementById("fleet-range").textContent === "101–200 of 10,000"`, 10*time.Second)
	c.eval(`(s => { s.value = "1000"; s.dispatchEvent(new Event("change")); return "ok"; })(document.getElementById("fleet-limit"))`)
	c.wait("pages of 1,000", rows+`.length === 1000 && `+first+` === "device-00001"`, 10*time.Second)
	c.do("next page of 1,000", chromedp.Click(chromedp.CSS("#fleet-next")))
	c.wait("devices 1,001 to 2,000", rows+`.length === 1000 && `+first+` === "device-01001" && `+rows+`[999].dataset.id === "device-02000"`, 10*time.Second)

	// device-01002 goes offline: its row and the counts change, live.
	_, err = st.ApplyPresence(context.Background(), "device-01002", wire.Presence{Online: false, Session: 3})
	require.NoError(t, err)
	c.wait("device-01002 offline on the page", `document.querySelector('#fleet tr[data-id="device-01002"]').dataset.online === "false" && `+
		`document.getElementById("fleet-online").textContent === "9,999"`, 10*time.Second)

	// Rollouts: progress, rate and the abort rule; then the abort, live.
	c.do("open rollouts", chromedp.Click(chromedp.CSS(`#nav a[data-view="rollouts"]`)), chromedp.WaitVisible(chromedp.CSS("#rollouts")))
	card := `document.querySelector('#rollout-list article.rollout[data-id="fw-42"]')`
	c.wait("the rollout's progress", card+` !== null && `+card+`.querySelector(".finished").textContent === "4,350 of 10,000 (43%)" && `+
		card+`.querySelectorAll(".progress .seg").length === 4 && `+card+`.querySelector('li[data-tripped="false"]') !== null`, 10*time.Second)
	c.screenshot("rollouts-running")
	fake.set(rolloutShape("aborted", "abort rule: failed reached 5%", map[string]int{"succeeded": 4300, "failed": 240, "cancelled": 5400, "started": 60}, true))
	bus.Publish(events.KindRollout, "fw-42", "aborted", time.Now())
	c.wait("the abort on the page", card+`.dataset.status === "aborted" && `+card+`.querySelector(".banner.abort") !== null && `+
		card+`.querySelector('li[data-tripped="true"]') !== null`, 10*time.Second)
	c.screenshot("rollouts-aborted")
	require.Equal(t, "once", c.eval(`window.__loaded`), "no page reload")
	require.Empty(t, c.exceptions(), "the page threw")
}
