package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/mcpserver"
	"github.com/fleetctl/fleetctl/internal/mcpserver/mcptest"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// The MCP tools against the real binaries: `controller mcp --server
// --token` started by the SDK's CommandTransport (stdio) and talking to a
// `controller serve` with tokens and a policy where restart needs
// approval (setupTasks), and /mcp of that daemon over streamable HTTP.

// stdioSession starts `controller mcp` for token (through CONTROLLER_TOKEN
// when env is set, as an agent host's config does) and connects the SDK's
// client to it; the process ends when the session closes its stdin.
func (b *bundle) stdioSession(t *testing.T, server, token string, env bool) (*mcp.ClientSession, *mcptest.Lossy) {
	t.Helper()
	args := []string{"mcp", "--server", server}
	cmd := exec.Command(testenv.Binary(t, "controller"), args...)
	cmd.Env = os.Environ()
	if env {
		cmd.Env = append(cmd.Env, "CONTROLLER_TOKEN="+token)
	} else {
		cmd.Args = append(cmd.Args, "--token", token)
	}
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	lossy := &mcptest.Lossy{Transport: &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "v0"}, nil).Connect(b.ctx(), lossy, nil)
	require.NoError(t, err, "controller mcp: %s", stderr)
	t.Cleanup(func() {
		require.NoError(t, cs.Close(), "controller mcp: %s", stderr)
		require.Empty(t, stderr.String(), "controller mcp logged at warn or above")
	})
	return cs, lossy
}

func mcpCall[T any](t *testing.T, cs *mcp.ClientSession, name string, args any) (T, *mcp.CallToolResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 70*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	out, err := mcptest.Decode[T](res)
	require.NoError(t, err)
	return out, res
}

func mcpOK[T any](t *testing.T, cs *mcp.ClientSession, name string, args any) T {
	t.Helper()
	out, res := mcpCall[T](t, cs, name, args)
	require.False(t, res.IsError, "%s: %s", name, mcptest.Text(res))
	return out
}

// mcpErr calls a tool that must fail with the API's status and code, in
// the text and the structured content.
func mcpErr(t *testing.T, cs *mcp.ClientSession, name string, args any, status int, code string) mcpserver.ToolError {
	t.Helper()
	out, res := mcpCall[mcpserver.Failure](t, cs, name, args)
	require.True(t, res.IsError, "%s: want tool error %s, got %s", name, code, mcptest.Text(res))
	require.NotNil(t, out.Error)
	require.Equal(t, code, out.Error.Code, mcptest.Text(res))
	require.Equal(t, status, out.Error.Status, mcptest.Text(res))
	prefix := code + ":"
	if status != 0 {
		prefix = strconv.Itoa(status) + " " + prefix
	}
	require.True(t, strings.HasPrefix(mcptest.Text(res), prefix), "%q lacks %q", mcptest.Text(res), prefix)
	return *out.Error
}

// A submit_operation whose answer is dropped after the server sent it,
// sent again with the same input, returns the same operation_id and
// command_id; the device executes once. A started result tells the agent
// to ask again with the same id.
func TestMCPStdioReplayAfterALostAnswer(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	cs, lossy := tb.stdioSession(t, tb.ctl.URL, "t-agent", false)
	args := map[string]any{"task_id": "mcp-lost", "step": "set-fw", "target": "device-1", "business_version": "v1",
		"action": "set-config", "params": map[string]any{"fw": "4.2"}}
	const id = "mcp-lost:set-fw:device-1:v1"
	p := &mcp.CallToolParams{Name: "submit_operation", Arguments: args}

	_, kept, err := mcptest.CallTwice(tb.ctx(), cs, lossy, p, true)
	require.NoError(t, err)
	require.False(t, kept.IsError, mcptest.Text(kept))
	replay, err := mcptest.Decode[mcpserver.OperationOutput](kept)
	require.NoError(t, err)
	require.Equal(t, id, replay.Operation.OperationID)
	require.Equal(t, new(false), replay.Created, "the dropped call created it")
	sc, isMap := kept.StructuredContent.(map[string]any)
	require.True(t, isMap, "%T", kept.StructuredContent)
	require.Equal(t, false, sc["created"], "the replay says created false: %v", sc)
	require.Equal(t, replay.Operation.Status == "started", sc["in_doubt"], "the replay says in_doubt: %v", sc)
	first, second, err := mcptest.CallTwice(tb.ctx(), cs, lossy, p, false)
	require.NoError(t, err)
	for _, res := range []*mcp.CallToolResult{first, second} {
		out, err := mcptest.Decode[mcpserver.OperationOutput](res)
		require.NoError(t, err)
		require.Equal(t, id, out.Operation.OperationID)
		require.Equal(t, replay.Operation.CommandID, out.Operation.CommandID)
		require.Equal(t, []string{replay.Operation.CommandID}, out.Operation.CommandIDs)
	}
	done := mcpOK[mcpserver.OperationOutput](t, cs, "get_operation", map[string]any{"operation_id": id, "wait": "30s"})
	require.Equal(t, "succeeded", done.Operation.Status)
	require.Equal(t, 1, tb.executions()[id], "one execution on the device")
	cmd := mcpOK[mcpserver.CommandOutput](t, cs, "get_command", map[string]any{"command_id": done.Operation.CommandID})
	require.Equal(t, "succeeded", cmd.Command.Status)

	// device-404 was never seen: its command waits, the operation stays started.
	const doubt = "mcp-doubt:set-fw:device-404:v1"
	started, res := mcpCall[mcpserver.OperationOutput](t, cs, "submit_operation", map[string]any{"task_id": "mcp-doubt",
		"step": "set-fw", "target": "device-404", "business_version": "v1", "action": "set-config"})
	require.False(t, res.IsError, mcptest.Text(res))
	asked := mcpOK[mcpserver.OperationOutput](t, cs, "get_operation", map[string]any{"operation_id": doubt, "wait": "200ms"})
	for _, o := range []mcpserver.OperationOutput{started, asked} {
		require.Equal(t, "started", o.Operation.Status)
		require.Equal(t, new(true), o.InDoubt)
		require.Contains(t, o.Next, fmt.Sprintf(`ask again with get_operation {"operation_id":%q`, doubt))
		require.Contains(t, o.Next, "never submit a new operation_id")
	}
	require.Contains(t, mcptest.Text(res), "is started: in doubt")
	require.Contains(t, mcptest.Text(res), "never submit a new operation_id")
	tb.verify()
}

// The API's refusals through the binary: 422, 403 approval_required, 403
// permission_denied, 403 forbidden (no operator role), 401, 404 and an
// unreachable daemon, each a tool error with its code.
func TestMCPStdioErrors(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	agent, _ := tb.stdioSession(t, tb.ctl.URL, "t-agent", true)
	mcpOK[mcpserver.OperationOutput](t, agent, "submit_operation", map[string]any{"operation_id": "mcp-e1", "target": "device-1",
		"action": "set-config", "params": map[string]any{"fw": "1"}})
	mcpErr(t, agent, "submit_operation", map[string]any{"operation_id": "mcp-e1", "target": "device-1",
		"action": "set-config", "params": map[string]any{"fw": "2"}}, 422, "idempotency_key_reused")
	e := mcpErr(t, agent, "submit_operation", map[string]any{"operation_id": "mcp-e2", "target": "device-1", "action": "restart"},
		403, "approval_required")
	require.Contains(t, e.Hint, "create_task")
	mcpErr(t, agent, "submit_operation", map[string]any{"operation_id": "mcp-e3", "target": "device-1", "action": "factory-reset"},
		403, "permission_denied")
	mcpErr(t, agent, "get_operation", map[string]any{"operation_id": "mcp-e2"}, 404, "not_found")

	viewer, _ := tb.stdioSession(t, tb.ctl.URL, "t-viewer", false)
	mcpErr(t, viewer, "submit_operation", map[string]any{"operation_id": "mcp-e4", "target": "device-1", "action": "set-config"},
		403, "forbidden")
	mcpErr(t, viewer, "cancel_command", map[string]any{"command_id": "c-none"}, 403, "forbidden")
	mcpOK[mcpserver.DeviceOutput](t, viewer, "get_device", map[string]any{"device_id": "device-1"})
	bad, _ := tb.stdioSession(t, tb.ctl.URL, "t-wrong", false)
	mcpErr(t, bad, "list_devices", map[string]any{}, 401, "unauthorized")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	down, _ := tb.stdioSession(t, closed, "t-agent", false)
	mcpErr(t, down, "get_device", map[string]any{"device_id": "device-1"}, 0, "unreachable")
}

// Every other tool through the binary: devices, tasks and plans, commands
// and their cancel, rollouts.
func TestMCPStdioEveryTool(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	cs, _ := tb.stdioSession(t, tb.ctl.URL, "t-agent", false)
	tools, err := cs.ListTools(tb.ctx(), nil)
	require.NoError(t, err)
	require.Len(t, tools.Tools, 11)
	for _, tool := range tools.Tools {
		require.NotContains(t, tool.Name, "approv")
	}

	page := mcpOK[mcpserver.DevicesOutput](t, cs, "list_devices", map[string]any{"limit": 2})
	require.Len(t, page.Devices, 2)
	require.EqualValues(t, 3, page.Total)
	rest := mcpOK[mcpserver.DevicesOutput](t, cs, "list_devices", map[string]any{"after": page.NextAfter})
	require.Len(t, rest.Devices, 1)
	d := mcpOK[mcpserver.DeviceOutput](t, cs, "get_device", map[string]any{"device_id": "device-1001"})
	require.True(t, d.Device.Online)

	steps := func(target string) []map[string]any {
		return []map[string]any{{"step": "restart-device", "action": "restart", "target": target, "params": map[string]any{}}}
	}
	task := mcpOK[mcpserver.TaskOutput](t, cs, "create_task", map[string]any{"task_id": "mcp-t", "steps": steps("device-1")})
	require.Equal(t, "waiting_approval", task.Task.Status)
	v2 := mcpOK[mcpserver.TaskOutput](t, cs, "update_plan", map[string]any{"task_id": "mcp-t", "steps": steps("device-2"), "base_version": 1})
	require.Equal(t, 2, v2.Task.Version)
	got := mcpOK[mcpserver.TaskOutput](t, cs, "get_task", map[string]any{"task_id": "mcp-t"})
	require.Equal(t, 2, got.Task.Version)
	require.Equal(t, "device-2", got.Task.Steps[0].Target)

	// A command that was never sent (device-404 never seen) is cancelled, twice the same.
	op := mcpOK[mcpserver.OperationOutput](t, cs, "submit_operation", map[string]any{"operation_id": "mcp-c1", "target": "device-404",
		"action": "set-config"})
	c := mcpOK[mcpserver.CommandOutput](t, cs, "get_command", map[string]any{"command_id": op.Operation.CommandID})
	require.Equal(t, 0, c.Command.Attempt)
	for range 2 {
		c = mcpOK[mcpserver.CommandOutput](t, cs, "cancel_command", map[string]any{"command_id": op.Operation.CommandID})
		require.Equal(t, "cancelled", c.Command.Status)
	}
	final := mcpOK[mcpserver.OperationOutput](t, cs, "get_operation", map[string]any{"operation_id": "mcp-c1"})
	require.Equal(t, "failed_final", final.Operation.Status)
	// The binary's stdio tools submit as their token's principal, via mcp;
	// the same token through the API submits via api.
	rec, err := tb.viewer.Operation(tb.ctx(), "mcp-c1", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"agent", "mcp"}, []string{rec.SubmittedBy, rec.Via})
	_, _, err = tb.agent.Submit(tb.ctx(), apiwire.SubmitRequest{OperationID: "api-c1", Target: "device-404", Action: "set-config"}, "")
	require.NoError(t, err)
	mine, err := tb.viewer.ListOperations(tb.ctx(), client.OperationQuery{SubmittedBy: "agent"})
	require.NoError(t, err)
	require.Len(t, mine, 2)
	require.Equal(t, []string{"api-c1", "api"}, []string{mine[0].OperationID, mine[0].Via}, "newest first")
	require.Equal(t, []string{"mcp-c1", "mcp"}, []string{mine[1].OperationID, mine[1].Via})

	// The rollout tools call /v1/rollouts: its answer, or its error, is theirs.
	out, res := mcpCall[mcpserver.RolloutOutput](t, cs, "create_rollout", map[string]any{"rollout_id": "mcp-r1",
		"action": "set-config", "params": map[string]any{"fw": "4.2"}, "devices": []string{"device-1", "device-2"}})
	if res.IsError {
		require.Equal(t, 404, out.Error.Status, mcptest.Text(res))
		require.Equal(t, "not_found", out.Error.Code)
		mcpErr(t, cs, "get_rollout", map[string]any{"rollout_id": "mcp-r1"}, 404, "not_found")
	} else {
		require.Equal(t, 2, out.Rollout.DevicesTotal)
		r := mcpOK[mcpserver.RolloutOutput](t, cs, "get_rollout", map[string]any{"rollout_id": "mcp-r1"})
		require.Equal(t, "mcp-r1", r.Rollout.RolloutID)
	}
}

// /mcp of `controller serve`: 401 without a valid token (before MCP), a
// token without the operator role cannot submit (a 403 forbidden tool
// error), an operator can, as itself.
func TestMCPOverHTTPTokensAndRoles(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"0"}}}`
	for _, auth := range []string{"", "Bearer t-wrong"} {
		req, err := http.NewRequestWithContext(tb.ctx(), http.MethodPost, tb.ctl.URL+"/mcp", strings.NewReader(initialize))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%q: %s", auth, body)
	}
	session := func(token string) *mcp.ClientSession {
		hc := &http.Client{Timeout: 90 * time.Second, Transport: bearerTransport{token: token}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "v0"}, nil).Connect(tb.ctx(),
			&mcp.StreamableClientTransport{Endpoint: tb.ctl.URL + "/mcp", HTTPClient: hc, DisableStandaloneSSE: true}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	viewer := session("t-viewer")
	mcpErr(t, viewer, "submit_operation", map[string]any{"operation_id": "mcp-h1", "target": "device-1", "action": "set-config"},
		403, "forbidden")
	mcpErr(t, viewer, "get_operation", map[string]any{"operation_id": "mcp-h1"}, 404, "not_found")
	agent := session("t-agent")
	op := mcpOK[mcpserver.OperationOutput](t, agent, "submit_operation", map[string]any{"operation_id": "mcp-h2",
		"target": "device-1", "action": "set-config"})
	require.Equal(t, new(true), op.Created)
	mcpErr(t, agent, "submit_operation", map[string]any{"operation_id": "mcp-h3", "target": "device-1", "action": "restart"},
		403, "approval_required")
	task := mcpOK[mcpserver.TaskOutput](t, agent, "create_task", map[string]any{"task_id": "mcp-h4",
		"steps": []map[string]any{{"step": "s", "action": "restart", "target": "device-1"}}})
	require.Equal(t, "agent", task.Task.CreatedBy, "the tool ran as the caller")
	done := mcpOK[mcpserver.OperationOutput](t, agent, "get_operation", map[string]any{"operation_id": "mcp-h2", "wait": "30s"})
	require.Equal(t, "succeeded", done.Operation.Status)
	require.Equal(t, 1, tb.executions()["mcp-h2"])
}

type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpSeedEnv seeds the session's dropped answers (a failing run names its
// seed; set it to repeat that run).
const mcpSeedEnv = "FLEETCTL_MCP_SEED"

// The MCP session: an agent creates a task, sees it wait for
// approval; a person approves through the dashboard (headless Chromium); the agent sees the
// step's operation succeed. Every agent tool call is sent twice and some
// first answers are dropped at random (seeded); the device executes once.
func TestMCPSessionTaskApprovedByAPerson(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	seed := uint64(16)
	if v := os.Getenv(mcpSeedEnv); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, mcpSeedEnv)
	}
	t.Logf("seed %d (%s=%d repeats this run)", seed, mcpSeedEnv, seed)
	cs, lossy := tb.stdioSession(t, tb.ctl.URL, "t-agent", false)
	agent := &mcptest.Agent{Session: cs, Lossy: lossy, Rand: rand.New(rand.NewPCG(seed, 0)), P: 0.5}
	call := func(name string, args any) *mcp.CallToolResult {
		t.Helper()
		kept, first, err := agent.Call(tb.ctx(), name, args)
		require.NoError(t, err, name)
		if first != nil {
			require.Equal(t, first.IsError, kept.IsError, "%s: both answers agree", name)
		}
		return kept
	}
	decode := func(res *mcp.CallToolResult) mcpserver.TaskOutput {
		t.Helper()
		require.False(t, res.IsError, mcptest.Text(res))
		out, err := mcptest.Decode[mcpserver.TaskOutput](res)
		require.NoError(t, err)
		return out
	}

	create := map[string]any{"task_id": "task-88", "steps": []map[string]any{{"step": "restart-device", "action": "restart",
		"target": "device-1001", "params": map[string]any{"reason": "stuck"}}}}
	created := decode(call("create_task", create))
	require.Equal(t, new(false), created.Created, "the second of two sends is a replay")
	require.Equal(t, "waiting_approval", created.Task.Status)
	waiting := decode(call("get_task", map[string]any{"task_id": "task-88"}))
	require.Equal(t, "waiting_approval", waiting.Task.Status)
	require.Contains(t, waiting.Next, "a person must approve version 1")
	require.Nil(t, waiting.Task.Steps[0].OperationID)

	// A person approves, through the dashboard in Chromium (no tool can).
	c := startChrome(t)
	c.do("open the dashboard", chromedp.Navigate(tb.ctl.URL+"/ui/#/approvals"), chromedp.WaitVisible(chromedp.CSS("#login-form")))
	c.do("alice signs in", chromedp.SendKeys(chromedp.CSS("#token"), "t-alice"), chromedp.Click(chromedp.CSS("#login-form button")))
	card := `#waiting article.task[data-id="task-88"]`
	c.wait("task-88 waiting on the page, approve offered", fmt.Sprintf(`(b => b !== null && !b.disabled)(document.querySelector(%s))`, q(card+" button.approve")), 20*time.Second)
	c.do("alice approves", chromedp.Click(chromedp.CSS(card+" button.approve")))
	c.screenshot("mcp-task-approved")

	const id = "task-88:restart-device:device-1001:approval-v1"
	var task mcpserver.TaskOutput
	eventually(t, "task-88 past approved", 30*time.Second, func() bool {
		task = decode(call("get_task", map[string]any{"task_id": "task-88"}))
		return task.Task.Status != "approved"
	})
	require.Equal(t, id, *task.Task.Steps[0].OperationID)
	var op mcpserver.OperationOutput
	deadline := time.Now().Add(45 * time.Second)
	for {
		res := call("get_operation", map[string]any{"operation_id": id, "wait": "30s"})
		require.False(t, res.IsError, mcptest.Text(res))
		var err error
		op, err = mcptest.Decode[mcpserver.OperationOutput](res)
		require.NoError(t, err)
		if op.Operation.Status != "started" {
			break
		}
		require.Equal(t, new(true), op.InDoubt)
		require.True(t, time.Now().Before(deadline), "still started after 45s")
	}
	require.Equal(t, "succeeded", op.Operation.Status)
	done := tb.waitTask("task-88", "completed")
	require.Equal(t, "alice", done.Approval.Approver)
	require.Equal(t, waiting.Task.PlanHash, done.Approval.PlanHash, "the version the agent saw waiting")
	require.Equal(t, map[string]int{id: 1}, tb.executions(), "exactly one execution on the device")
	t.Logf("agent: %d tool calls sent, %d first answers dropped", agent.Calls, agent.Dropped)
	require.Positive(t, agent.Dropped, "some answers were dropped")
	require.Less(t, agent.Dropped, agent.Calls/2, "not every answer was dropped")
	tb.verify()
}
