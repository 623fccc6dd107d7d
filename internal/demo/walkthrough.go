package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/mcpserver"
)

// demoTokens are the principals of the demo: an agent that proposes plans,
// a person who approves them, an administrator who grants.
const demoTokens = `[{"token":"demo-agent","principal":"agent","roles":["operator","approver"]},
 {"token":"demo-alice","principal":"alice","roles":["approver"]},
 {"token":"demo-admin","principal":"admin","roles":["admin"]}]`

func grantAgent(ctx context.Context, apiURL string) error {
	admin := client.New(apiURL, "demo-admin")
	for _, action := range []string{"restart", "set-config"} {
		if _, err := admin.Do(ctx, http.MethodPost, "/v1/grants", nil,
			apiwire.GrantRequest{Principal: "agent", Action: action, Devices: "device-*"}, nil); err != nil {
			return fmt.Errorf("grant %s: %w", action, err)
		}
	}
	return nil
}

// walkthrough runs the contract's ten steps for task-88 and prints them.
// The agent works through the MCP tools (agent.go), every call sent twice;
// alice, a person, approves through the API, as the dashboard's button
// does (she could use the dashboard at the URL printed at the start).
func walkthrough(ctx context.Context, apiURL string, out io.Writer) error {
	ag, err := connectAgent(ctx, apiURL, "demo-agent")
	if err != nil {
		return err
	}
	defer ag.close()
	alice := client.New(apiURL, "demo-alice")
	say := func(n int, format string, args ...any) {
		fmt.Fprintf(out, "    %2d. %s\n", n, fmt.Sprintf(format, args...))
	}
	plan := func(target string) []map[string]any {
		return []map[string]any{{"step": "restart-device", "action": "restart", "target": target, "params": map[string]any{"reason": "stuck"}}}
	}
	fmt.Fprintln(out, "\n==> walkthrough: task-88, the approval-then-restart of the contract")
	fmt.Fprintln(out, "    (the agent speaks MCP to /mcp, sends every tool call twice, and loses about half of the first answers)")
	created, err := call[mcpserver.TaskOutput](ctx, ag, mcpserver.ToolCreateTask, map[string]any{"task_id": "task-88", "steps": plan("device-1")})
	if err != nil {
		return err
	}
	v := created.Task
	say(1, "agent proposes a plan with create_task: task-88 v%d, restart-device on device-1", v.Version)
	say(2, "its hash and version are stored: plan_hash %.16s…, version %d (author agent)", v.PlanHash, v.Version)
	for i, target := range []string{"device-2", "device-1001"} {
		up, err := call[mcpserver.TaskOutput](ctx, ag, mcpserver.ToolUpdatePlan, map[string]any{"task_id": "task-88", "steps": plan(target), "base_version": i + 1})
		if err != nil {
			return err
		}
		v = up.Task
		fmt.Fprintf(out, "        agent revises the plan with update_plan: v%d targets %s (plan_hash %.16s…)\n", v.Version, target, v.PlanHash)
	}
	again, err := call[mcpserver.TaskOutput](ctx, ag, mcpserver.ToolUpdatePlan, map[string]any{"task_id": "task-88", "steps": plan("device-1001")})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "        the same revision sent again: still v%d\n", again.Task.Version)
	say(3, "the task waits for approval: %s", v.Status)
	tools, err := ag.Session.ListTools(ctx, nil)
	if err != nil {
		return fmt.Errorf("list tools: %w", err)
	}
	fmt.Fprintf(out, "        the agent's %d tools have none that approves: a person does\n", len(tools.Tools))
	if _, err := alice.Do(ctx, http.MethodPost, "/v1/tasks/task-88/approvals", nil, map[string]any{"version": 2}, nil); err != nil {
		fmt.Fprintf(out, "        alice approves the superseded v2: refused (%s)\n", client.Code(err))
	}
	var a apiwire.ApprovalV
	status, err := alice.Do(ctx, http.MethodPost, "/v1/tasks/task-88/approvals", nil, map[string]any{"version": 3, "plan_hash": v.PlanHash}, &a)
	if err != nil {
		return fmt.Errorf("approve: %w", err)
	}
	say(4, "alice approves version %d (%d); a double click answers %d", a.Version, status, mustStatus(alice.Do(ctx, http.MethodPost,
		"/v1/tasks/task-88/approvals", nil, map[string]any{"version": 3}, nil)))
	deadline := time.Now().Add(60 * time.Second)
	for v.Status != "completed" && v.Status != "failed" && v.Status != "rejected" {
		if time.Now().After(deadline) {
			return fmt.Errorf("task-88 still %s after 60s", v.Status)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
		got, err := call[mcpserver.TaskOutput](ctx, ag, mcpserver.ToolGetTask, map[string]any{"task_id": "task-88"})
		if err != nil {
			return err
		}
		v = got.Task
	}
	var checks []string
	for _, h := range v.History {
		checks = append(checks, fmt.Sprintf("%s→%s", h.From, h.To))
	}
	say(5, "permissions (agent's grant), the device (seen) and the plan hash are checked again, in the step's transaction")
	if len(v.Steps) == 0 || v.Steps[0].OperationID == nil {
		return fmt.Errorf("task-88 %s with no step operation", v.Status)
	}
	opID := *v.Steps[0].OperationID
	got, err := call[mcpserver.OperationOutput](ctx, ag, mcpserver.ToolGetOperation, map[string]any{"operation_id": opID, "wait": "10s"})
	if err != nil {
		return err
	}
	op := got.Operation
	say(6, "operation %s inserted as started (UNIQUE), in that same transaction; the agent follows it with get_operation", opID)
	gc, err := call[mcpserver.CommandOutput](ctx, ag, mcpserver.ToolGetCommand, map[string]any{"command_id": op.CommandID})
	if err != nil {
		return err
	}
	cmd := gc.Command
	say(7, "command %s issued to %s", cmd.CommandID, cmd.DeviceID)
	var rs []string
	for _, r := range cmd.Receipts {
		rs = append(rs, fmt.Sprintf("%s (seq %d, %s)", r.Status, r.Seq, r.Effect))
	}
	say(8, "the device answers %s", strings.Join(rs, ", "))
	say(9, "the operation is %s, its result stored: %s", op.Status, compactJSON(op.Result))
	say(10, "the task goes on: %s (history %s)", v.Status, strings.Join(checks, ", "))
	if _, err := call[mcpserver.OperationOutput](ctx, ag, mcpserver.ToolSubmitOperation,
		map[string]any{"operation_id": opID, "target": "device-1001", "action": "restart"}); err != nil {
		fmt.Fprintf(out, "        the agent submits %s itself with submit_operation: refused (%s)\n", opID, errCode(err))
	}
	fmt.Fprintf(out, "        the agent made %d tool calls, each sent twice (%d sends), and lost %d first answers; the command was published %d time(s), under one command_id\n",
		ag.Calls/2, ag.Calls, ag.Dropped, cmd.Attempt)
	if v.Status != "completed" || op.Status != "succeeded" {
		return fmt.Errorf("task-88 ended %s, its operation %s", v.Status, op.Status)
	}
	return nil
}

func mustStatus(status int, _ error) int { return status }

func compactJSON(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}
