package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/sim"
)

// TestAuditNamesWhoDidWhat: with --tokens, bob resolves a needs_attention
// command with a note and alice approves a task; GET /v1/audit?principal=
// lists exactly each one's changes, the resolve with its note, and the
// command's events carry bob as their principal. The command shows in the
// gauge controller_commands{status="needs_attention"} while it waits, and
// leaves it after the resolve.
func TestAuditNamesWhoDidWhat(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) { auditNamesWhoDidWhat(t, be) })
}

func auditNamesWhoDidWhat(t *testing.T, be string) {
	tb := setupTasks(t, setupOpts{backend: be, args: []string{"--ack-timeout", "300ms", "--max-attempts", "2"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{
			Legacy:        sim.Legacy{Enabled: true, Dedupe: false, Query: true},
			DropReceipt:   sim.ReceiptFault{Trigger: sim.Trigger{P: 1}, Statuses: []string{sim.ClassFinal}},
			IgnoreQueries: sim.Trigger{P: 1},
		}}}}})
	eventually(t, "legacy capabilities seen", 10*time.Second, func() bool {
		d, err := tb.viewer.Device(tb.ctx(), "device-2")
		return err == nil && d.Seen && !d.Capabilities.Dedupe
	})
	op, _, err := tb.bob.Submit(tb.ctx(), apiwire.SubmitRequest{OperationID: "audit-1", Target: "device-2", Action: "set-config",
		Params: json.RawMessage(`{"k":"v"}`)}, "")
	require.NoError(t, err)
	tb.waitCommand(op.CommandID, "needs_attention")
	// The state gauge shows it (refreshed from the database every 5 s),
	// and every other state at 0 or more.
	const waiting = `controller_commands{status="needs_attention"}`
	eventually(t, "the gauge shows the needs_attention command", 20*time.Second, func() bool { return tb.metric(waiting) == 1 })
	require.Contains(t, tb.metrics(), `controller_commands{status="cancelled"} 0`, "every state is present")
	require.Contains(t, tb.metrics(), `controller_operations{status="failed_retryable"} 0`)
	const note = "checked on site: the config is applied"
	_, err = tb.bob.Resolve(tb.ctx(), op.CommandID, "succeeded", note)
	require.NoError(t, err)
	eventually(t, "the resolved command leaves the gauge", 20*time.Second, func() bool { return tb.metric(waiting) == 0 })
	eventually(t, "the resolved command counted as succeeded", 20*time.Second, func() bool {
		return tb.metric(`controller_commands{status="succeeded"}`) >= 1
	})

	status, code := do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-a", "steps": steps("device-1")}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/task-a/approvals", map[string]any{"version": 1}, nil)
	require.Equal(t, http.StatusCreated, status, code)

	// Any valid token reads the audit (the viewer has no role).
	bob, err := tb.viewer.ListAudit(tb.ctx(), client.AuditQuery{Principal: "bob"})
	require.NoError(t, err)
	require.Len(t, bob, 1, "bob's one change: the resolve (a submit is attributed on the operation, not here)")
	require.Equal(t, "resolve", bob[0].Action)
	require.Equal(t, "command", bob[0].Kind)
	require.Equal(t, op.CommandID, bob[0].ID)
	var d map[string]any
	require.NoError(t, json.Unmarshal(bob[0].Detail, &d))
	require.Equal(t, note, d["note"])
	require.Equal(t, "succeeded", d["outcome"])
	require.Equal(t, "audit-1", d["operation_id"])

	alice, err := tb.viewer.ListAudit(tb.ctx(), client.AuditQuery{Principal: "alice"})
	require.NoError(t, err)
	require.Len(t, alice, 1)
	require.Equal(t, "approve", alice[0].Action)
	require.Equal(t, "task", alice[0].Kind)
	require.Equal(t, "task-a", alice[0].ID)

	all, err := tb.viewer.ListAudit(tb.ctx(), client.AuditQuery{Limit: 2})
	require.NoError(t, err)
	// setupTasks's four grants by admin, the resolve, the task's create
	// by agent and its approval, newest first.
	require.Len(t, all, 7)
	require.Equal(t, []string{"alice", "agent", "bob"}, []string{all[0].Principal, all[1].Principal, all[2].Principal})
	for _, e := range all[3:] {
		require.Equal(t, "admin", e.Principal)
		require.Equal(t, "grant", e.Action)
	}

	cmd := tb.command(op.CommandID)
	last := cmd.Events[len(cmd.Events)-1]
	require.Equal(t, "succeeded", last.To)
	require.Equal(t, "bob", last.Principal, "the resolve's event names its principal")
	require.Empty(t, cmd.Events[0].Principal, "the controller's own events name none")

	_, err = tb.viewer.ListAudit(tb.ctx(), client.AuditQuery{Limit: 1001})
	require.Equal(t, "invalid_request", client.Code(err))
	_, err = client.New(tb.ctl.URL, "").ListAudit(tb.ctx(), client.AuditQuery{})
	require.Equal(t, "unauthorized", client.Code(err))
}

// metrics is the controller's /metrics text.
func (b *bundle) metrics() string {
	b.t.Helper()
	resp, err := http.Get(b.ctl.URL + "/metrics")
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return string(body)
}
