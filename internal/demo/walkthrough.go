package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/api"
	"github.com/fleetctl/fleetctl/internal/client"
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
			api.GrantRequest{Principal: "agent", Action: action, Devices: "device-*"}, nil); err != nil {
			return fmt.Errorf("grant %s: %w", action, err)
		}
	}
	return nil
}

// walkthrough runs the contract's ten steps for task-88 and prints them.
func walkthrough(ctx context.Context, apiURL string, out io.Writer) error {
	agent, alice := client.New(apiURL, "demo-agent"), client.New(apiURL, "demo-alice")
	say := func(n int, format string, args ...any) {
		fmt.Fprintf(out, "    %2d. %s\n", n, fmt.Sprintf(format, args...))
	}
	plan := func(target string) []map[string]any {
		return []map[string]any{{"step": "restart-device", "action": "restart", "target": target, "params": map[string]any{"reason": "stuck"}}}
	}
	fmt.Fprintln(out, "\n==> walkthrough: task-88, the approval-then-restart of the contract")
	var v api.TaskView
	if _, err := agent.Do(ctx, http.MethodPost, "/v1/tasks", nil, map[string]any{"task_id": "task-88", "steps": plan("device-1")}, &v); err != nil {
		return fmt.Errorf("create task: %w", err)
	}
	say(1, "agent submits a plan: task-88 v%d, restart-device on device-1", v.Version)
	say(2, "its hash and version are stored: plan_hash %.16s…, version %d (author agent)", v.PlanHash, v.Version)
	for i, target := range []string{"device-2", "device-1001"} {
		if _, err := agent.Do(ctx, http.MethodPut, "/v1/tasks/task-88/plan", nil, map[string]any{"steps": plan(target), "base_version": i + 1}, &v); err != nil {
			return fmt.Errorf("revise plan: %w", err)
		}
		fmt.Fprintf(out, "        agent revises the plan: v%d targets %s (plan_hash %.16s…)\n", v.Version, target, v.PlanHash)
	}
	if _, err := agent.Do(ctx, http.MethodPut, "/v1/tasks/task-88/plan", nil, map[string]any{"steps": plan("device-1001")}, &v); err != nil {
		return err
	}
	fmt.Fprintf(out, "        the same revision retried after a lost response: still v%d\n", v.Version)
	say(3, "the task waits for approval: %s", v.Status)
	if _, err := agent.Do(ctx, http.MethodPost, "/v1/tasks/task-88/approvals", nil, map[string]any{"version": 3}, nil); err != nil {
		fmt.Fprintf(out, "        agent tries to approve its own version: refused (%s)\n", client.Code(err))
	}
	if _, err := alice.Do(ctx, http.MethodPost, "/v1/tasks/task-88/approvals", nil, map[string]any{"version": 2}, nil); err != nil {
		fmt.Fprintf(out, "        alice approves the superseded v2: refused (%s)\n", client.Code(err))
	}
	var a api.ApprovalV
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
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
		if _, err := alice.Do(ctx, http.MethodGet, "/v1/tasks/task-88", nil, nil, &v); err != nil {
			return err
		}
	}
	var checks []string
	for _, h := range v.History {
		checks = append(checks, fmt.Sprintf("%s→%s", h.From, h.To))
	}
	say(5, "permissions (agent's grant), the device (seen) and the plan hash are checked again, in the step's transaction")
	opID := *v.Steps[0].OperationID
	op, err := alice.Operation(ctx, opID, 10*time.Second)
	if err != nil {
		return err
	}
	say(6, "operation %s inserted as started (UNIQUE), in that same transaction", opID)
	cmd, err := alice.Command(ctx, op.CommandID)
	if err != nil {
		return err
	}
	say(7, "command %s issued to %s", cmd.CommandID, cmd.DeviceID)
	var rs []string
	for _, r := range cmd.Receipts {
		rs = append(rs, fmt.Sprintf("%s (seq %d, %s)", r.Status, r.Seq, r.Effect))
	}
	say(8, "the device answers %s", strings.Join(rs, ", "))
	result, _ := json.Marshal(json.RawMessage(op.Result))
	say(9, "the operation is %s, its result stored: %s", op.Status, compactJSON(result))
	say(10, "the task goes on: %s (history %s)", v.Status, strings.Join(checks, ", "))
	if _, _, err := agent.Submit(ctx, api.SubmitRequest{OperationID: opID, Target: "device-1001", Action: "restart"}, ""); err != nil {
		fmt.Fprintf(out, "        a direct submit of %s: refused (%s)\n", opID, client.Code(err))
	}
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
