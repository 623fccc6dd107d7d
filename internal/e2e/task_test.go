package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/sim"
)

// taskBundle is a system with auth on: tokens, grants, and restart needing approval.
type taskBundle struct {
	*bundle
	agent, bob, alice, admin, viewer *client.Client
	args                             []string // the controller's, for a peer
}

func setupTasks(t *testing.T, o setupOpts) *taskBundle {
	dir := t.TempDir()
	tokens := `[{"token":"t-agent","principal":"agent","roles":["operator","approver"]},
		{"token":"t-bob","principal":"bob","roles":["operator","approver"]},
		{"token":"t-alice","principal":"alice","roles":["approver"]},
		{"token":"t-admin","principal":"admin","roles":["admin"]},
		{"token":"t-viewer","principal":"viewer","roles":[]}]`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.json"), []byte(tokens), 0o600))
	if o.ids == nil && o.devices == 0 {
		o.ids = []string{"device-1001", "device-1", "device-2"}
	}
	o.args = append(append(o.args, "--tokens", filepath.Join(dir, "tokens.json")), policyArgs(t, `{"actions":{"restart":{"approval":"required"}}}`)...)
	o.token = "t-viewer"
	b := setup(t, o)
	tb := &taskBundle{bundle: b,
		agent: client.New(b.ctl.URL, "t-agent"), bob: client.New(b.ctl.URL, "t-bob"), alice: client.New(b.ctl.URL, "t-alice"),
		admin: client.New(b.ctl.URL, "t-admin"), viewer: b.client, args: o.args}
	for _, who := range []string{"agent", "bob"} {
		for _, action := range []string{"restart", "set-config"} {
			status, err := tb.admin.Do(b.ctx(), http.MethodPost, "/v1/grants", nil, apiwire.GrantRequest{Principal: who, Action: action, Devices: "device-*"}, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, status)
		}
	}
	return tb
}

func steps(target string) []map[string]any {
	return []map[string]any{{"step": "restart-device", "action": "restart", "target": target, "params": map[string]any{"reason": "stuck"}}}
}

func (tb *taskBundle) task(id string) apiwire.TaskView {
	var v apiwire.TaskView
	_, err := tb.viewer.Do(tb.ctx(), http.MethodGet, "/v1/tasks/"+id, nil, nil, &v)
	require.NoError(tb.t, err)
	return v
}

func (tb *taskBundle) waitTask(id, status string) apiwire.TaskView {
	var v apiwire.TaskView
	eventually(tb.t, "task "+id+" "+status, 30*time.Second, func() bool {
		v = tb.task(id)
		return v.Status == status
	})
	return v
}

func do(t *testing.T, c *client.Client, method, path string, body, out any) (int, string) {
	status, err := c.Do(t.Context(), method, path, nil, body, out)
	return status, client.Code(err)
}

func TestWalkthroughTask88(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		tb := setupTasks(t, setupOpts{backend: be})
		// 1-2: an agent submits a plan; its hash and version are stored.
		var v apiwire.TaskView
		status, code := do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-88", "steps": steps("device-1")}, &v)
		require.Equal(t, http.StatusCreated, status, code)
		require.Equal(t, 1, v.Version)
		require.Len(t, v.PlanHash, 64)
		// Two revisions: versions 2 and 3.
		for i, target := range []string{"device-2", "device-1001"} {
			status, code = do(t, tb.agent, http.MethodPut, "/v1/tasks/task-88/plan", map[string]any{"steps": steps(target), "base_version": i + 1}, &v)
			require.Equal(t, http.StatusOK, status, code)
			require.Equal(t, i+2, v.Version)
		}
		// 3: it waits for approval; the step has no operation yet.
		require.Equal(t, "waiting_approval", v.Status)
		require.Nil(t, v.Steps[0].OperationID)
		// 4: a person approves version 3.
		var a apiwire.ApprovalV
		status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/task-88/approvals", map[string]any{"version": 3, "plan_hash": v.PlanHash}, &a)
		require.Equal(t, http.StatusCreated, status, code)
		require.Equal(t, "alice", a.Approver)
		// 5-10: re-checks, the operation inserted, a command issued, the device answers, the task goes on.
		done := tb.waitTask("task-88", "completed")
		const opID = "task-88:restart-device:device-1001:approval-v3"
		require.Equal(t, opID, *done.Steps[0].OperationID)
		require.Equal(t, "agent", done.Requester)
		op, err := tb.viewer.Operation(tb.ctx(), opID, 0)
		require.NoError(t, err)
		require.Equal(t, "succeeded", op.Status)
		require.Contains(t, string(op.Result), "restarted")
		cmd := tb.command(op.CommandID)
		var seen []string
		for _, r := range cmd.Receipts {
			seen = append(seen, r.Status)
		}
		require.Equal(t, []string{"received", "executing", "succeeded"}, seen)
		require.Equal(t, map[string]int{opID: 1}, tb.executions())
		var actions []string
		for _, h := range done.History {
			actions = append(actions, h.Action+":"+h.To)
		}
		t.Logf("task-88 history: %v", actions)
		require.Equal(t, "create:waiting_approval", actions[0])
		tb.verify()
	})
}

func TestDoubleClickedApproval(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	status, code := do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-dc", "steps": steps("device-1")}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	var wg sync.WaitGroup
	statuses := make([]int, 20)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _ = do(t, tb.alice, http.MethodPost, "/v1/tasks/task-dc/approvals", map[string]any{"version": 1}, nil)
		}()
	}
	wg.Wait()
	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	require.Equal(t, map[int]int{201: 1, 200: 19}, count)
	tb.waitTask("task-dc", "completed")
	require.Equal(t, []string{"1"}, tb.rows(`SELECT COUNT(*) FROM approvals`))
	require.Equal(t, []string{"1"}, tb.rows(`SELECT COUNT(*) FROM operations`))
	require.Equal(t, map[string]int{"task-dc:restart-device:device-1:approval-v1": 1}, tb.executions())
	tb.verify()
}

func TestPlanRetryAndStaleApproval(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	status, code := do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-p", "steps": steps("device-1")}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	var v apiwire.TaskView
	// A plan update retried after a lost response: no new version.
	for range 2 {
		status, code := do(t, tb.agent, http.MethodPut, "/v1/tasks/task-p/plan", map[string]any{"steps": steps("device-2")}, &v)
		require.Equal(t, http.StatusOK, status, code)
		require.Equal(t, 2, v.Version)
	}
	status, code = do(t, tb.agent, http.MethodPut, "/v1/tasks/task-p/plan", map[string]any{"steps": steps("device-1001"), "base_version": 1}, nil)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "stale_version", code)
	// Approving the superseded version 1: refused; nothing runs.
	status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/task-p/approvals", map[string]any{"version": 1}, nil)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "stale_version", code)
	status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/task-p/approvals", map[string]any{"version": 2, "plan_hash": "0000"}, nil)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "stale_version", code, "a plan_hash that differs")
	require.Equal(t, "waiting_approval", tb.task("task-p").Status)
	require.Equal(t, []string{"0"}, tb.rows(`SELECT COUNT(*) FROM operations`))
	// (step, target) unique; a bad plan is 400.
	dup := append(steps("device-1"), steps("device-1")...)
	status, code = do(t, tb.agent, http.MethodPut, "/v1/tasks/task-p/plan", map[string]any{"steps": dup}, nil)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "invalid_plan", code)
	// The same create replayed: 200; other content: 422.
	status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-p", "steps": steps("device-1")}, nil)
	require.Equal(t, http.StatusOK, status, code)
	status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-p", "steps": steps("device-2")}, nil)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "idempotency_key_reused", code)
}

func TestGrantRevokedBeforeTheWindowOpens(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	sn := sniff(t, tb.broker.URL())
	var grants []apiwire.GrantView
	_, err := tb.viewer.Do(tb.ctx(), http.MethodGet, "/v1/grants", nil, nil, &grants)
	require.NoError(t, err)
	after := time.Now().Add(3 * time.Second).UTC()
	status, code := do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-w", "steps": steps("device-1"),
		"execute_after": after.Format(time.RFC3339Nano)}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/task-w/approvals", map[string]any{"version": 1}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	require.Equal(t, "approved", tb.task("task-w").Status, "waits for the window")
	for _, g := range grants {
		if g.Principal == "agent" && g.Action == "restart" {
			var rv apiwire.GrantView
			status, code = do(t, tb.admin, http.MethodDelete, "/v1/grants/"+g.GrantID, nil, &rv)
			require.Equal(t, http.StatusOK, status, code)
			require.NotNil(t, rv.RevokedAt)
			status, _ = do(t, tb.admin, http.MethodDelete, "/v1/grants/"+g.GrantID, nil, nil)
			require.Equal(t, http.StatusOK, status, "revoking again")
		}
	}
	v := tb.waitTask("task-w", "rejected")
	require.Equal(t, "permission_revoked", v.Reason)
	require.False(t, time.Now().Before(after), "refused when the window opened")
	cmds, _ := sn.of("task-w:restart-device:device-1:approval-v1")
	require.Empty(t, cmds, "no command published")
	require.Empty(t, tb.executions())
	require.Equal(t, []string{"0"}, tb.rows(`SELECT COUNT(*) FROM operations`))
	tb.verify()
}

func TestPermissionsAndFourEyes(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{})
	anon := client.New(tb.ctl.URL, "")
	status, code := do(t, anon, http.MethodGet, "/v1/tasks/x", nil, nil)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Equal(t, "unauthorized", code)
	status, code = do(t, tb.viewer, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "t", "steps": steps("device-1")}, nil)
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "forbidden", code)
	// A grant limited to one device.
	status, _ = do(t, tb.admin, http.MethodPost, "/v1/grants", apiwire.GrantRequest{Principal: "carol", Action: "restart", Devices: "device-1"}, nil)
	require.Equal(t, http.StatusCreated, status)
	status, _ = do(t, tb.admin, http.MethodPost, "/v1/grants", apiwire.GrantRequest{Principal: "carol", Action: "restart", Devices: "device-1"}, nil)
	require.Equal(t, http.StatusOK, status, "a live grant posted again")
	status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "t-nodev", "steps": steps("device-9")}, nil)
	require.Equal(t, http.StatusCreated, status, "agent may restart device-*: %s", code)
	status, code = do(t, tb.admin, http.MethodPost, "/v1/grants", apiwire.GrantRequest{Principal: "agent", Action: "reboot", Devices: "device-1"}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "t-other",
		"steps": []map[string]any{{"step": "s", "action": "reboot", "target": "device-2"}}}, nil)
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "permission_denied", code, "reboot is granted on device-1 only")
	// Direct submits: an approval-required action, a reserved id.
	_, status, err := tb.agent.Submit(tb.ctx(), req("direct", "device-1"), "")
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "approval_required", client.Code(err))
	_, status, err = tb.agent.Submit(tb.ctx(), apiwire.SubmitRequest{OperationID: "x:s:device-1:approval-v1", Target: "device-1", Action: "set-config"}, "")
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "reserved_operation_id", client.Code(err))
	require.Equal(t, []string{"0"}, tb.rows(`SELECT COUNT(*) FROM operations`))

	// Four eyes: bob wrote v2, so bob cannot approve it; agent, the task's creator, can.
	status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "t-4", "steps": steps("device-1")}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks/t-4/approvals", map[string]any{"version": 1}, nil)
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "four_eyes", code, "agent wrote v1")
	status, code = do(t, tb.bob, http.MethodPut, "/v1/tasks/t-4/plan", map[string]any{"steps": steps("device-2")}, nil)
	require.Equal(t, http.StatusOK, status, code)
	status, code = do(t, tb.bob, http.MethodPost, "/v1/tasks/t-4/approvals", map[string]any{"version": 2}, nil)
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "four_eyes", code, "bob wrote v2")
	status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/t-4/approvals", map[string]any{"version": 2}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	v := tb.waitTask("t-4", "completed")
	require.Equal(t, "bob", v.Requester)
	status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "t-5", "steps": steps("device-1")}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	status, code = do(t, tb.bob, http.MethodPut, "/v1/tasks/t-5/plan", map[string]any{"steps": steps("device-2")}, nil)
	require.Equal(t, http.StatusOK, status, code)
	status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks/t-5/approvals", map[string]any{"version": 2}, nil)
	require.Equal(t, http.StatusCreated, status, "the creator approves a version someone else wrote: %s", code)

	// Late approval or plan change of a completed task: replayed or refused.
	status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/t-4/approvals", map[string]any{"version": 2}, nil)
	require.Equal(t, http.StatusOK, status, "exact replay: %s", code)
	status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks/t-4/approvals", map[string]any{"version": 2}, nil)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "illegal_state", code)
	status, code = do(t, tb.bob, http.MethodPut, "/v1/tasks/t-4/plan", map[string]any{"steps": steps("device-1001")}, nil)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "illegal_state", code)
	status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/t-4/rejections", map[string]any{"reason": "late"}, nil)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "illegal_state", code)
	require.Equal(t, "completed", tb.task("t-4").Status)
	require.Equal(t, 1, tb.executions()["t-4:restart-device:device-2:approval-v2"])
	// t-5 runs too: the invariants are checked on a settled fleet.
	tb.waitTask("t-5", "completed")
	require.Equal(t, 1, tb.executions()["t-5:restart-device:device-2:approval-v2"])
	tb.verify()
}

func TestTaskSurvivesCrashes(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		tb := setupTasks(t, setupOpts{backend: be, env: []string{"CONTROLLER_FAILPOINTS=before-step-insert=1*crash"},
			faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{
				SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(1500 * time.Millisecond)}}}}}})
		status, code := do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-c", "steps": steps("device-1")}, nil)
		require.Equal(t, http.StatusCreated, status, code)
		status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/task-c/approvals", map[string]any{"version": 1}, nil)
		// The runner may reach the step, and crash, before the approval's
		// answer is written (on a loaded machine): the approval is committed
		// either way, which the task completing after the restart shows.
		if status != 0 {
			require.Equal(t, http.StatusCreated, status, code)
		}
		require.Equal(t, 137, tb.ctl.ExitCode(), "crashed between approval and execution")
		tb.ctl.Restart()
		tb.waitTask("task-c", "completed")
		require.Equal(t, 1, tb.executions()["task-c:restart-device:device-1:approval-v1"])

		// kill -9 during execution.
		status, code = do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-k", "steps": steps("device-2")}, nil)
		require.Equal(t, http.StatusCreated, status, code)
		status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/task-k/approvals", map[string]any{"version": 1}, nil)
		require.Equal(t, http.StatusCreated, status, code)
		const opID = "task-k:restart-device:device-2:approval-v1"
		eventually(t, "step running", 20*time.Second, func() bool {
			op, err := tb.viewer.Operation(tb.ctx(), opID, 0)
			return err == nil && len(op.CommandIDs) == 1 && tb.command(op.CommandID).Status == "executing"
		})
		tb.ctl.Kill()
		tb.ctl.Restart()
		tb.waitTask("task-k", "completed")
		require.Equal(t, 1, tb.executions()[opID])
		tb.verify()
	})
}

func TestCompensation(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{
		SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(1500 * time.Millisecond)}}}}}})
	orig := apiwire.SubmitRequest{OperationID: "cfg-1", Target: "device-2", Action: "set-config", Params: json.RawMessage(`{"interval_s":5}`)}
	op, status, err := tb.agent.Submit(tb.ctx(), orig, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	comp := map[string]any{"action": "set-config", "params": map[string]any{"interval_s": 60}, "reason": "undo", "business_version": "v1"}
	path := "/v1/operations/cfg-1/compensations"
	status, code := do(t, tb.agent, http.MethodPost, path, comp, nil)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "not_final", code)
	require.Equal(t, "succeeded", tb.waitFinal(op.OperationID).Status)
	before, err := tb.viewer.Operation(tb.ctx(), "cfg-1", 0)
	require.NoError(t, err)

	var c apiwire.Operation
	status, code = do(t, tb.agent, http.MethodPost, path, comp, &c)
	require.Equal(t, http.StatusCreated, status, code)
	require.Equal(t, "cfg-1:compensate:v1", c.OperationID)
	require.Equal(t, "cfg-1", c.Compensates)
	require.Equal(t, "device-2", c.Target)
	status, code = do(t, tb.agent, http.MethodPost, path, comp, &c)
	require.Equal(t, http.StatusOK, status, "a retry returns it: %s", code)
	comp["params"] = map[string]any{"interval_s": 61}
	status, code = do(t, tb.agent, http.MethodPost, path, comp, nil)
	require.Equal(t, http.StatusUnprocessableEntity, status)
	require.Equal(t, "idempotency_key_reused", code)
	comp["business_version"] = "approval-v2"
	status, code = do(t, tb.agent, http.MethodPost, path, comp, nil)
	require.Equal(t, http.StatusBadRequest, status, "a business_version that looks like an approval: %s", code)
	comp["business_version"], comp["action"] = "v2", "restart"
	status, code = do(t, tb.agent, http.MethodPost, path, comp, nil)
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "approval_required", code)

	final := tb.waitFinal("cfg-1:compensate:v1")
	require.Equal(t, "succeeded", final.Status, "its own state machine")
	require.Regexp(t, `"interval_s":\s*60`, string(final.Result))
	after, err := tb.viewer.Operation(tb.ctx(), "cfg-1", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"cfg-1:compensate:v1"}, after.Compensations)
	after.Compensations = before.Compensations
	after.LeaseExpiresAt = before.LeaseExpiresAt
	require.Equal(t, before, after, "the original is never rewritten")
	// Compensating a compensation is allowed the same way.
	status, code = do(t, tb.agent, http.MethodPost, "/v1/operations/cfg-1:compensate:v1/compensations",
		map[string]any{"action": "set-config", "params": map[string]any{"interval_s": 5}, "business_version": "v1"}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	require.Equal(t, 1, tb.executions()["cfg-1"])
	t.Logf("compensation: %s", fmt.Sprint(tb.executions()))
	tb.verify()
}
