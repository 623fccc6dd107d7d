package mcpserver_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/mcpserver"
	"github.com/fleetctl/fleetctl/internal/mcpserver/mcptest"
)

var toolNames = []string{"cancel_command", "create_rollout", "create_task", "get_command", "get_device", "get_operation",
	"get_rollout", "get_task", "list_devices", "submit_operation", "update_plan"}

// The tools are the contract's eleven, none approves, their annotations
// are the ones the package doc argues for, every schema is an object, and
// the descriptions teach the operation_id rule and what in doubt means.
func TestToolsAnnotationsAndDescriptions(t *testing.T) {
	t.Parallel()
	cs, _ := sessionTo(t, "http://127.0.0.1:1", "")
	res, err := cs.ListTools(ctx(t), nil)
	require.NoError(t, err)
	byName := map[string]*mcp.Tool{}
	var names []string
	for _, tool := range res.Tools {
		byName[tool.Name] = tool
		names = append(names, tool.Name)
		require.NotContains(t, tool.Name, "approv", "no tool approves")
		require.NotNil(t, tool.Annotations, tool.Name)
		for what, schema := range map[string]any{"input": tool.InputSchema, "output": tool.OutputSchema} {
			m, ok := schema.(map[string]any)
			require.True(t, ok, "%s %s schema: %T", tool.Name, what, schema)
			require.Equal(t, "object", m["type"], "%s %s schema", tool.Name, what)
		}
	}
	slices.Sort(names)
	require.Equal(t, toolNames, names)

	type hints struct{ readOnly, destructive, idempotent, openWorld bool }
	want := map[string]hints{
		"submit_operation": {false, true, true, true},
		"create_rollout":   {false, true, true, true},
		"cancel_command":   {false, true, true, false},
		"create_task":      {false, false, true, false},
		"update_plan":      {false, false, true, false},
		"get_operation":    {true, false, true, false},
		"get_command":      {true, false, true, false},
		"list_devices":     {true, false, true, false},
		"get_device":       {true, false, true, false},
		"get_task":         {true, false, true, false},
		"get_rollout":      {true, false, true, false},
	}
	for name, w := range want {
		a := byName[name].Annotations
		got := hints{a.ReadOnlyHint, a.DestructiveHint != nil && *a.DestructiveHint, a.IdempotentHint,
			a.OpenWorldHint != nil && *a.OpenWorldHint}
		require.Equal(t, w, got, name)
		require.NotNil(t, a.DestructiveHint, name)
		require.NotNil(t, a.OpenWorldHint, name)
	}
	submit := byName["submit_operation"].Description
	for _, s := range []string{"task_id:step:target:business_version", "[A-Za-z0-9._-]{1,64}", "same id", "new intent",
		`still "started" is in doubt`, "get_operation", "never submit a new operation_id", "approval_required"} {
		require.Contains(t, submit, s)
	}
	require.Contains(t, byName["get_operation"].Description, `still "started" is in doubt`)
	require.Contains(t, byName["create_task"].Description, "There is no tool that approves")
	require.Contains(t, cs.InitializeResult().Instructions, "there is no tool that approves")
	// The submit's input schema names the API's fields, target and action required.
	in := byName["submit_operation"].InputSchema.(map[string]any)
	require.ElementsMatch(t, []any{"target", "action"}, in["required"])
	require.Contains(t, in["properties"], "business_version")
}

// A submit whose answer was lost after the server sent it, and is sent
// again with the same arguments, returns the same operation and
// command_id, and the device executes once.
func TestSubmitReplayedAfterALostAnswerRunsOnce(t *testing.T) {
	t.Parallel()
	b := start(t)
	cs, lossy := b.session(t, "t-agent")
	args := map[string]any{"task_id": "t-lost", "step": "set-fw", "target": "device-1", "business_version": "v1",
		"action": "set-config", "params": map[string]any{"fw": "4.2"}}
	p := &mcp.CallToolParams{Name: "submit_operation", Arguments: args}

	first, second, err := mcptest.CallTwice(ctx(t), cs, lossy, p, true)
	require.NoError(t, err)
	require.Nil(t, first, "the first answer was dropped")
	require.False(t, second.IsError, mcptest.Text(second))
	again, err := mcptest.Decode[mcpserver.OperationOutput](second)
	require.NoError(t, err)
	const id = "t-lost:set-fw:device-1:v1"
	require.Equal(t, id, again.Operation.OperationID)
	require.Equal(t, new(false), again.Created, "the lost call created it; the replay got the stored record")
	// The replay says created false and in_doubt, as the first submit does,
	// rather than leaving them out.
	sc, isMap := second.StructuredContent.(map[string]any)
	require.True(t, isMap, "%T", second.StructuredContent)
	require.Equal(t, false, sc["created"], "%v", sc)
	require.Equal(t, again.Operation.Status == "started", sc["in_doubt"], "%v", sc)
	require.Contains(t, mcptest.Text(second), "nothing ran again")
	require.NotEmpty(t, again.Operation.CommandID)

	// Both answers this time: the same command_id.
	first, second, err = mcptest.CallTwice(ctx(t), cs, lossy, p, false)
	require.NoError(t, err)
	for _, res := range []*mcp.CallToolResult{first, second} {
		out, err := mcptest.Decode[mcpserver.OperationOutput](res)
		require.NoError(t, err)
		require.Equal(t, again.Operation.CommandID, out.Operation.CommandID)
		require.Equal(t, []string{again.Operation.CommandID}, out.Operation.CommandIDs)
	}

	done := ok[mcpserver.OperationOutput](t, cs, "get_operation", map[string]any{"operation_id": id, "wait": "30s"})
	require.Equal(t, "succeeded", done.Operation.Status)
	require.Equal(t, new(false), done.InDoubt)
	require.Equal(t, map[string]int{id: 1}, b.executions())
	cmd := ok[mcpserver.CommandOutput](t, cs, "get_command", map[string]any{"command_id": done.Operation.CommandID})
	require.Equal(t, "succeeded", cmd.Command.Status)
	require.NotEmpty(t, cmd.Command.Receipts)
}

// An operation still started is in doubt: the result says so and tells
// the agent to ask again with the same id, never a new one. A command
// never sent can be cancelled, again with the same answer.
func TestStartedIsInDoubtAndCancel(t *testing.T) {
	t.Parallel()
	b := start(t)
	cs, _ := b.session(t, "t-agent")
	// device-9 was never seen: the command waits for it (offline policy wait).
	const id = "t-doubt:set-fw:device-9:v1"
	out, res := call[mcpserver.OperationOutput](t, cs, "submit_operation", map[string]any{"task_id": "t-doubt", "step": "set-fw",
		"target": "device-9", "business_version": "v1", "action": "set-config", "params": map[string]any{"fw": "4.2"}})
	require.False(t, res.IsError, mcptest.Text(res))
	require.Equal(t, new(true), out.Created)
	for _, o := range []mcpserver.OperationOutput{out,
		ok[mcpserver.OperationOutput](t, cs, "get_operation", map[string]any{"operation_id": id, "wait": "100ms"})} {
		require.Equal(t, "started", o.Operation.Status)
		require.Equal(t, new(true), o.InDoubt)
		require.Contains(t, o.Next, fmt.Sprintf(`get_operation {"operation_id":%q`, id))
		require.Contains(t, o.Next, "never submit a new operation_id")
	}
	require.Contains(t, mcptest.Text(res), "in doubt")
	require.Contains(t, mcptest.Text(res), "never submit a new operation_id")

	cmd := ok[mcpserver.CommandOutput](t, cs, "get_command", map[string]any{"command_id": out.Operation.CommandID})
	require.Equal(t, 0, cmd.Command.Attempt)
	require.Contains(t, cmd.Next, "cancel_command can still cancel it")
	for range 2 {
		c := ok[mcpserver.CommandOutput](t, cs, "cancel_command", map[string]any{"command_id": out.Operation.CommandID})
		require.Equal(t, "cancelled", c.Command.Status)
	}
	final := ok[mcpserver.OperationOutput](t, cs, "get_operation", map[string]any{"operation_id": id})
	require.Equal(t, "failed_final", final.Operation.Status)
	require.Equal(t, new(false), final.InDoubt)
	// A sent command cannot be cancelled.
	sent := ok[mcpserver.OperationOutput](t, cs, "submit_operation", map[string]any{"operation_id": "t-sent-1",
		"target": "device-2", "action": "set-config"})
	ok[mcpserver.OperationOutput](t, cs, "get_operation", map[string]any{"operation_id": "t-sent-1", "wait": "30s"})
	toolErr(t, cs, "cancel_command", map[string]any{"command_id": sent.Operation.CommandID}, 409, "already_published")
}

// The API's refusals are tool errors with its status and code, in the
// text and in the structured content, never a silent success.
func TestAPIErrorsAreToolErrors(t *testing.T) {
	t.Parallel()
	b := start(t)
	agent, _ := b.session(t, "t-agent")
	submit := map[string]any{"operation_id": "t-err-1", "target": "device-1", "action": "set-config", "params": map[string]any{"fw": "1"}}
	ok[mcpserver.OperationOutput](t, agent, "submit_operation", submit)

	reused := map[string]any{"operation_id": "t-err-1", "target": "device-1", "action": "set-config", "params": map[string]any{"fw": "2"}}
	e := toolErr(t, agent, "submit_operation", reused, 422, "idempotency_key_reused")
	require.Contains(t, e.Hint, "new intent needs a new id")

	e = toolErr(t, agent, "submit_operation", map[string]any{"operation_id": "t-err-2", "target": "device-1", "action": "restart"},
		403, "approval_required")
	require.Contains(t, e.Hint, "create_task")

	carol, _ := b.session(t, "t-carol")
	toolErr(t, carol, "submit_operation", map[string]any{"operation_id": "t-err-3", "target": "device-1", "action": "set-config"},
		403, "permission_denied")
	viewer, _ := b.session(t, "t-viewer")
	toolErr(t, viewer, "submit_operation", map[string]any{"operation_id": "t-err-4", "target": "device-1", "action": "set-config"},
		403, "forbidden")
	toolErr(t, viewer, "create_task", map[string]any{"task_id": "t-err-5", "steps": []any{}}, 403, "forbidden")
	nobody, _ := b.session(t, "t-nobody")
	toolErr(t, nobody, "get_device", map[string]any{"device_id": "device-1"}, 401, "unauthorized")

	toolErr(t, agent, "get_operation", map[string]any{"operation_id": "t-err-none"}, 404, "not_found")
	toolErr(t, agent, "get_operation", map[string]any{"operation_id": "t-err-1", "wait": "2m"}, 400, "invalid_wait")
	toolErr(t, agent, "submit_operation", map[string]any{"operation_id": "x:approval-v1", "target": "device-1", "action": "set-config"},
		403, "reserved_operation_id")

	// The params reach the API as the agent wrote them: an integer past
	// 2^53 and a duplicate key are its 400, not silently rounded or merged
	// by the SDK's decoding.
	for _, raw := range []string{
		`{"operation_id":"t-err-6","target":"device-1","action":"set-config","params":{"n":9007199254740993}}`,
		`{"operation_id":"t-err-7","target":"device-1","action":"set-config","params":{"fw":"1","fw":"2"}}`,
	} {
		toolErr(t, agent, "submit_operation", json.RawMessage(raw), 400, "invalid_request")
	}
	// Nothing was created by any of these.
	for _, id := range []string{"t-err-2", "t-err-3", "t-err-4", "t-err-6", "t-err-7"} {
		toolErr(t, agent, "get_operation", map[string]any{"operation_id": id}, 404, "not_found")
	}

	// A controller that does not listen: nothing was sent.
	down, _ := sessionTo(t, "http://"+closedAddr(t), "t-agent")
	e = toolErr(t, down, "submit_operation", submit, 0, "unreachable")
	require.False(t, e.InDoubt)
}

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// A task through the tools: created (a replay returns it), waiting for
// approval, a new plan version (a replay returns it), approved by a person
// through the API, its step's operation followed to success, once.
func TestTaskThroughTheTools(t *testing.T) {
	t.Parallel()
	b := start(t)
	cs, _ := b.session(t, "t-agent")
	steps := func(target string) []map[string]any {
		return []map[string]any{{"step": "restart-device", "action": "restart", "target": target, "params": map[string]any{"reason": "stuck"}}}
	}
	create := map[string]any{"task_id": "t-task", "steps": steps("device-1")}
	created := ok[mcpserver.TaskOutput](t, cs, "create_task", create)
	require.Equal(t, new(true), created.Created)
	require.Equal(t, "waiting_approval", created.Task.Status)
	require.Equal(t, "agent", created.Task.CreatedBy)
	require.Contains(t, created.Next, "there is no approve tool")
	replay := ok[mcpserver.TaskOutput](t, cs, "create_task", create)
	require.Equal(t, new(false), replay.Created)
	toolErr(t, cs, "create_task", map[string]any{"task_id": "t-task", "steps": steps("device-2")}, 422, "idempotency_key_reused")

	plan := map[string]any{"task_id": "t-task", "steps": steps("device-2"), "base_version": 1}
	for range 2 {
		v := ok[mcpserver.TaskOutput](t, cs, "update_plan", plan)
		require.Equal(t, 2, v.Task.Version)
	}
	toolErr(t, cs, "update_plan", map[string]any{"task_id": "t-task", "steps": steps("device-3"), "base_version": 1}, 409, "stale_version")
	got := ok[mcpserver.TaskOutput](t, cs, "get_task", map[string]any{"task_id": "t-task"})
	require.Equal(t, "waiting_approval", got.Task.Status)
	require.Nil(t, got.Task.Steps[0].OperationID)

	_, status, err := b.alice.Approve(ctx(t), "t-task", apiwire.ApprovalRequest{Version: 2})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	const id = "t-task:restart-device:device-2:approval-v2"
	var op mcpserver.OperationOutput
	deadline := time.Now().Add(30 * time.Second)
	for {
		got = ok[mcpserver.TaskOutput](t, cs, "get_task", map[string]any{"task_id": "t-task"})
		require.Equal(t, id, *got.Task.Steps[0].OperationID)
		if got.Task.Status != "approved" {
			break
		}
		require.True(t, time.Now().Before(deadline), "task still approved after 30s")
		<-time.After(20 * time.Millisecond) // poll interval of a deadline-bounded wait
	}
	op = ok[mcpserver.OperationOutput](t, cs, "get_operation", map[string]any{"operation_id": id, "wait": "30s"})
	require.Equal(t, "succeeded", op.Operation.Status)
	require.Equal(t, map[string]int{id: 1}, b.executions())
}

// list_devices pages the fleet; get_device reads one, a never seen one too.
func TestDevices(t *testing.T) {
	t.Parallel()
	b := start(t)
	cs, _ := b.session(t, "t-viewer")
	page := ok[mcpserver.DevicesOutput](t, cs, "list_devices", map[string]any{"limit": 2})
	require.Len(t, page.Devices, 2)
	require.EqualValues(t, 3, page.Total)
	require.Equal(t, "device-2", page.NextAfter)
	rest := ok[mcpserver.DevicesOutput](t, cs, "list_devices", map[string]any{"limit": 2, "after": page.NextAfter})
	require.Len(t, rest.Devices, 1)
	require.Equal(t, "device-3", rest.Devices[0].DeviceID)
	require.Empty(t, rest.NextAfter)
	offline := ok[mcpserver.DevicesOutput](t, cs, "list_devices", map[string]any{"online": false})
	require.Empty(t, offline.Devices)
	toolErr(t, cs, "list_devices", map[string]any{"limit": 100000}, 400, "invalid_request")

	d := ok[mcpserver.DeviceOutput](t, cs, "get_device", map[string]any{"device_id": "device-1"})
	require.True(t, d.Device.Online)
	require.True(t, d.Device.Seen)
	// Its commands: the API's in_flight and queued, passed on as arrays
	// (empty here: nothing is in flight), never left out.
	require.NotNil(t, d.Device.InFlight, "in_flight carried")
	require.NotNil(t, d.Device.Queued, "queued carried")
	require.Empty(t, d.Device.InFlight)
	require.Empty(t, d.Device.Queued)
	unseen := ok[mcpserver.DeviceOutput](t, cs, "get_device", map[string]any{"device_id": "device-77"})
	require.False(t, unseen.Device.Seen)
}

// The rollout tools call POST and GET /v1/rollouts: whatever the API
// answers is the tool's, an error as a tool error.
func TestRollouts(t *testing.T) {
	t.Parallel()
	b := start(t)
	cs, _ := b.session(t, "t-agent")
	create := map[string]any{"rollout_id": "fw-42", "action": "set-config", "params": map[string]any{"fw": "4.2"},
		"devices": "device-*", "max_per_minute": 600}
	out, res := call[mcpserver.RolloutOutput](t, cs, "create_rollout", create)
	if res.IsError {
		require.Equal(t, "not_found", out.Error.Code, "no /v1/rollouts route yet: %s", mcptest.Text(res))
		require.Equal(t, 404, out.Error.Status)
		toolErr(t, cs, "get_rollout", map[string]any{"rollout_id": "fw-42"}, 404, "not_found")
		return
	}
	require.Equal(t, "fw-42", out.Rollout.RolloutID)
	require.Equal(t, 3, out.Rollout.DevicesTotal)
	got := ok[mcpserver.RolloutOutput](t, cs, "get_rollout", map[string]any{"rollout_id": "fw-42"})
	require.Equal(t, "fw-42", got.Rollout.RolloutID)
	// A list of ids is a devices value too.
	_, res = call[mcpserver.RolloutOutput](t, cs, "create_rollout", map[string]any{"rollout_id": "fw-43", "action": "set-config",
		"devices": []string{"device-1"}})
	require.False(t, res.IsError, mcptest.Text(res))
}

// /mcp inside the controller: 401 without a valid token, before MCP; with
// one, each tool call runs as the caller's principal with its roles.
func TestHTTPEndpoint(t *testing.T) {
	t.Parallel()
	b := start(t)
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"0"}}}`
	for _, auth := range []string{"", "Bearer nope", "Basic dDp0"} {
		req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, b.url+"/mcp", strings.NewReader(initialize))
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
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "Authorization %q: %s", auth, body)
		require.Contains(t, string(body), `"unauthorized"`)
	}

	viewer := b.httpSession(t, "t-viewer", nil)
	tools, err := viewer.ListTools(ctx(t), nil)
	require.NoError(t, err)
	require.Len(t, tools.Tools, len(toolNames))
	toolErr(t, viewer, "submit_operation", map[string]any{"operation_id": "h-1", "target": "device-1", "action": "set-config"}, 403, "forbidden")
	ok[mcpserver.DeviceOutput](t, viewer, "get_device", map[string]any{"device_id": "device-1"})

	// Each caller's principal: the task's author is whoever called.
	for _, who := range []string{"agent", "bob"} {
		cs := b.httpSession(t, "t-"+who, nil)
		task := ok[mcpserver.TaskOutput](t, cs, "create_task", map[string]any{"task_id": "h-" + who,
			"steps": []map[string]any{{"step": "s", "action": "restart", "target": "device-1"}}})
		require.Equal(t, who, task.Task.CreatedBy)
	}
	carol := b.httpSession(t, "t-carol", nil)
	toolErr(t, carol, "submit_operation", map[string]any{"operation_id": "h-2", "target": "device-1", "action": "set-config"}, 403, "permission_denied")

	// A lost answer over HTTP: the POST that carried the call reached the
	// controller, its answer is thrown away; the same call again returns
	// the same operation and command.
	lossy := &lossyHTTP{next: http.DefaultTransport}
	agent := b.httpSession(t, "t-agent", lossy)
	args := map[string]any{"operation_id": "h-lost", "target": "device-3", "action": "set-config", "params": map[string]any{"fw": "9"}}
	lossy.dropNext()
	_, err = agent.CallTool(ctx(t), &mcp.CallToolParams{Name: "submit_operation", Arguments: args})
	require.Error(t, err)
	require.True(t, lossy.dropped(), "the answer was dropped: %v", err)
	agent = b.httpSession(t, "t-agent", nil) // a host reconnects after a broken connection
	again := ok[mcpserver.OperationOutput](t, agent, "submit_operation", args)
	require.Equal(t, new(false), again.Created)
	third := ok[mcpserver.OperationOutput](t, agent, "submit_operation", args)
	require.Equal(t, again.Operation.CommandID, third.Operation.CommandID)
	ok[mcpserver.OperationOutput](t, agent, "get_operation", map[string]any{"operation_id": "h-lost", "wait": "30s"})
	require.Equal(t, 1, b.executions()["h-lost"])
}

// lossyHTTP throws away the answer to the next POST that carries a
// tools/call, after the server sent it.
type lossyHTTP struct {
	next http.RoundTripper
	mu   sync.Mutex
	arm  bool
	did  bool
}

func (l *lossyHTTP) dropNext() { l.mu.Lock(); l.arm = true; l.mu.Unlock() }
func (l *lossyHTTP) dropped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.did
}

func (l *lossyHTTP) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := l.next.RoundTrip(r)
	l.mu.Lock()
	drop := l.arm && bytes.Contains(body, []byte(`"tools/call"`))
	if drop {
		l.arm, l.did = false, true
	}
	l.mu.Unlock()
	if err != nil || !drop {
		return resp, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, errors.New("lossyHTTP: the answer was lost")
}

// Every operation records who submitted it and through which channel: a
// submit tool call says mcp with the principal of its token (over /mcp and
// in process), a submit of the API api, a compensation compensation, a
// task step task with its approver and version, a rollout device rollout
// with the rollout's creator and approver.
func TestOperationsAreAttributed(t *testing.T) {
	t.Parallel()
	b := start(t)
	c := ctx(t)
	get := func(id string) apiwire.Operation {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			op, err := b.admin.Operation(c, id, 0)
			if err == nil {
				return op
			}
			require.Equal(t, "not_found", client.Code(err), "%s: %v", id, err)
			require.True(t, time.Now().Before(deadline), "no operation %s after 30s", id)
			<-time.After(20 * time.Millisecond) // poll interval of a deadline-bounded wait
		}
	}
	attributed := func(id, by, via, approver string, version int) {
		t.Helper()
		op := get(id)
		require.Equal(t, []any{by, via, approver, version}, []any{op.SubmittedBy, op.Via, op.ApprovedBy, op.ApprovedVersion}, id)
	}

	agent := b.httpSession(t, "t-agent", nil)
	ok[mcpserver.OperationOutput](t, agent, "submit_operation", map[string]any{"operation_id": "a-http", "target": "device-1", "action": "set-config"})
	attributed("a-http", "agent", "mcp", "", 0)
	bob, _ := b.session(t, "t-bob")
	ok[mcpserver.OperationOutput](t, bob, "submit_operation", map[string]any{"operation_id": "a-mem", "target": "device-2", "action": "set-config"})
	attributed("a-mem", "bob", "mcp", "", 0)

	bobAPI := client.New(b.url, "t-bob")
	_, _, err := bobAPI.Submit(c, apiwire.SubmitRequest{OperationID: "a-api", Target: "device-3", Action: "set-config"}, "")
	require.NoError(t, err)
	attributed("a-api", "bob", "api", "", 0)
	// A replay through another channel keeps the first attribution.
	again := ok[mcpserver.OperationOutput](t, agent, "submit_operation", map[string]any{"operation_id": "a-api", "target": "device-3", "action": "set-config"})
	require.Equal(t, new(false), again.Created)
	attributed("a-api", "bob", "api", "", 0)
	_, err = bobAPI.Operation(c, "a-api", 30*time.Second)
	require.NoError(t, err)
	var comp apiwire.Operation
	_, err = bobAPI.Do(c, http.MethodPost, "/v1/operations/a-api/compensations", nil,
		apiwire.CompensationRequest{Action: "set-config", Reason: "undo", BusinessVersion: "v1"}, &comp)
	require.NoError(t, err)
	attributed("a-api:compensate:v1", "bob", "compensation", "", 0)
	// A made-up channel is refused.
	status, err := bobAPI.Do(c, http.MethodPost, "/v1/operations", http.Header{apiwire.ViaHeader: {"carrier-pigeon"}},
		apiwire.SubmitRequest{OperationID: "a-bad", Target: "device-3", Action: "set-config"}, nil)
	require.Equal(t, http.StatusBadRequest, status, "%v", err)

	// A task's step: its requester, the approver and the approved version.
	ok[mcpserver.TaskOutput](t, agent, "create_task", map[string]any{"task_id": "a-task",
		"steps": []map[string]any{{"step": "s", "action": "set-config", "target": "device-1"}}})
	_, _, err = b.alice.Approve(c, "a-task", apiwire.ApprovalRequest{Version: 1})
	require.NoError(t, err)
	attributed("a-task:s:device-1:approval-v1", "agent", "task", "alice", 1)

	// A rollout's devices: its creator, and its approver when it needed one.
	ok[mcpserver.RolloutOutput](t, agent, "create_rollout", map[string]any{"rollout_id": "a-ro", "action": "set-config",
		"devices": []string{"device-2"}})
	attributed("a-ro:rollout:device-2:v1", "agent", "rollout", "", 0)
	ok[mcpserver.RolloutOutput](t, agent, "create_rollout", map[string]any{"rollout_id": "a-ra", "action": "restart",
		"devices": []string{"device-3"}})
	_, _, err = b.alice.ApproveRollout(c, "a-ra", 1)
	require.NoError(t, err)
	attributed("a-ra:rollout:device-3:v1", "agent", "rollout", "alice", 1)

	// The list finds them by submitter.
	mine, err := b.admin.ListOperations(c, client.OperationQuery{SubmittedBy: "bob"})
	require.NoError(t, err)
	var ids []string
	for _, op := range mine {
		ids = append(ids, op.OperationID)
	}
	require.ElementsMatch(t, []string{"a-mem", "a-api", "a-api:compensate:v1"}, ids)
}
