package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/sim"
)

// TestTaskTakenOverAfterItsHolderIsKilled: two instances on PostgreSQL;
// the one whose runner holds a two-step task's lease is killed (kill -9,
// not restarted) while the first step executes. The other takes the task
// over once the lease ran out (with a new fencing token), follows the
// first step to its end and runs the second: the task completes, each
// step's operation inserted and executed once.
func TestTaskTakenOverAfterItsHolderIsKilled(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{backend: "postgres", args: []string{"--lease-ttl", "2s"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-1", Faults: sim.Faults{
			SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(3 * time.Second)}}}}}})
	peer, _ := tb.peer("i2", nil, tb.args...)
	ctls := map[string]struct {
		kill   func()
		viewer *client.Client
	}{
		"i1": {tb.ctl.Kill, tb.viewer},
		"i2": {peer.Kill, client.New(peer.URL, "t-viewer")},
	}
	other := map[string]string{"i1": "i2", "i2": "i1"}
	plan := []map[string]any{
		{"step": "drain", "action": "restart", "target": "device-1", "params": map[string]any{"reason": "slow"}},
		{"step": "reboot", "action": "restart", "target": "device-2", "params": map[string]any{"reason": "after"}},
	}
	status, code := do(t, tb.agent, http.MethodPost, "/v1/tasks", map[string]any{"task_id": "task-l", "steps": plan}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	status, code = do(t, tb.alice, http.MethodPost, "/v1/tasks/task-l/approvals", map[string]any{"version": 1}, nil)
	require.Equal(t, http.StatusCreated, status, code)
	const op0, op1 = "task-l:drain:device-1:approval-v1", "task-l:reboot:device-2:approval-v1"
	eventually(t, "first step executing", 20*time.Second, func() bool {
		op, err := tb.viewer.Operation(tb.ctx(), op0, 0)
		return err == nil && len(op.CommandIDs) == 1 && tb.command(op.CommandID).Status == "executing"
	})
	lease := func() (string, int) {
		row := tb.rows(`SELECT owner || ' ' || fencing_token FROM tasks WHERE task_id = 'task-l'`)
		require.Len(t, row, 1)
		owner, token, _ := strings.Cut(row[0], " ")
		n, err := strconv.Atoi(token)
		require.NoError(t, err)
		return owner, n
	}
	holder, token := lease()
	require.Contains(t, other, holder, "the task has a runner")
	ctls[holder].kill()
	t.Logf("kill -9 of %s, the task's runner (fencing token %d), during its first step", holder, token)

	survivor := other[holder]
	var done apiwire.TaskView
	eventually(t, "task completed after the takeover", 60*time.Second, func() bool {
		_, err := ctls[survivor].viewer.Do(tb.ctx(), http.MethodGet, "/v1/tasks/task-l", nil, nil, &done)
		return err == nil && done.Status == "completed"
	})
	owner, newToken := lease()
	t.Logf("completed under %s with fencing token %d", owner, newToken)
	require.Equal(t, survivor, owner)
	require.Greater(t, newToken, token)
	require.Equal(t, []string{op0 + " 1", op1 + " 1"},
		tb.rows(`SELECT operation_id || ' ' || COUNT(*) FROM operations WHERE task_id = 'task-l' GROUP BY operation_id ORDER BY 1`),
		"each step's operation inserted once")
	ex := tb.executions()
	require.Equal(t, 1, ex[op0], "first step executed once")
	require.Equal(t, 1, ex[op1], "second step executed once")
	require.Contains(t, tb.rows(`SELECT to_state || ': ' || reason FROM events WHERE machine = 'lease' AND entity_id = 'task-l'`),
		survivor+": task runner: takeover of an expired lease")
	var runs []string
	for _, h := range done.History {
		if h.Action == "run" {
			runs = append(runs, h.From+"→"+h.To)
		}
	}
	require.Equal(t, []string{"approved→running", "running→running", "running→completed"}, runs, "one move per decision")
}
