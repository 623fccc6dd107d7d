package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/client"
)

func TestFailpointSubmitBeforeCommitError(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{env: []string{"CONTROLLER_FAILPOINTS=submit-before-commit=1*error"}})
	require.Contains(t, b.ctl.Output(), "failpoint armed: submit-before-commit=1*error")
	_, status, err := b.client.Submit(b.ctx(), req("task-fp1", "device-1"), "")
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, "unavailable", client.Code(err))
	_, err = b.client.Operation(b.ctx(), "task-fp1:restart:device-1:v1", 0)
	require.Equal(t, "not_found", client.Code(err), "nothing stored")
	require.Equal(t, []string{"0|0"}, b.rows(`SELECT (SELECT COUNT(*) FROM operations), (SELECT COUNT(*) FROM commands)`))

	op, status, err := b.client.Submit(b.ctx(), req("task-fp1", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, "the retry succeeds, once")
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	require.Equal(t, 1.0, b.metric(`controller_failpoint_hits_total{name="submit-before-commit"}`))
	b.verify()
}

func TestFailpointSubmitAfterCommitCrash(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{env: []string{"CONTROLLER_FAILPOINTS=submit-after-commit=1*crash"}})
	_, _, err := b.client.Submit(b.ctx(), req("task-fp2", "device-2"), "")
	require.Error(t, err, "the caller sees the connection fail")
	require.Empty(t, client.Code(err), "no HTTP answer at all: %v", err)
	require.Equal(t, 137, b.ctl.ExitCode())

	b.ctl.Restart() // no failpoints
	op, status, err := b.client.Submit(b.ctx(), req("task-fp2", "device-2"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "the commit stood: the retry finds it")
	cmds := b.rows(`SELECT command_id FROM commands`)
	require.Equal(t, []string{op.CommandID}, cmds, "the same command_id, no second one")
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	b.verify()
}

func TestFailpointSubmitAfterCommitError(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{env: []string{"CONTROLLER_FAILPOINTS=submit-after-commit=1*error"}})
	_, status, err := b.client.Submit(b.ctx(), req("task-fp2e", "device-2"), "")
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Error(t, err)
	op, status, err := b.client.Submit(b.ctx(), req("task-fp2e", "device-2"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, []string{op.CommandID}, b.rows(`SELECT command_id FROM commands`))
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	b.verify()
}

func TestFailpointBeforePublishCrash(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be, env: []string{"CONTROLLER_FAILPOINTS=before-publish=1*crash"}})
		// The dispatcher may crash the process before or after the 201 is
		// written: the caller may see either, and retries when it saw nothing.
		_, status, err := b.client.Submit(b.ctx(), req("task-fp3", "device-3"), "")
		if err == nil {
			require.Equal(t, http.StatusCreated, status)
		}
		require.Equal(t, 137, b.ctl.ExitCode(), "crashed after the pending → sent commit")
		require.Equal(t, []string{"sent|1"}, b.rows(`SELECT status, attempt FROM commands`))
		require.Empty(t, b.executions(), "nothing reached the device")

		b.ctl.Restart()
		op, status, err := b.client.Submit(b.ctx(), req("task-fp3", "device-3"), "")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		final := b.waitFinal(op.OperationID)
		require.Equal(t, "succeeded", final.Status)
		require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
		cmd, err := b.client.Command(b.ctx(), op.CommandID)
		require.NoError(t, err)
		require.Equal(t, []string{op.CommandID}, final.CommandIDs, "no new command_id")
		require.Equal(t, 2, cmd.Attempt, "asked first, then published the committed command once")
		// Asked before the re-send: by the reclaim's counted ask or by the
		// reconnect's pass over every open command (not counted against
		// max_attempts), whichever claimed it first; either way the device's
		// unknown answer to a query is on record.
		asked := false
		for _, r := range cmd.Receipts {
			asked = asked || r.QueryID != "" && r.Status == "unknown"
		}
		require.True(t, asked, "the device was asked about the command before it was published again: %+v", cmd.Receipts)
		b.verify()
	})
}

func TestFailpointAfterPublishError(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{env: []string{"CONTROLLER_FAILPOINTS=after-publish=1*error"}})
	op, _, err := b.client.Submit(b.ctx(), req("task-fp4", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	require.Equal(t, 1.0, b.metric(`controller_publish_failures_total{kind="command"}`), "counted as unconfirmed")
}

func TestFailpointBeforeReceiptCommit(t *testing.T) {
	t.Parallel()
	// The process dies with the first receipt uncommitted (so not yet
	// acknowledged to the broker): the restarted controller still learns the
	// outcome, from the broker's redelivery to its session or by asking.
	b := setup(t, setupOpts{env: []string{"CONTROLLER_FAILPOINTS=before-receipt-commit=1*crash"}})
	_, _, _ = b.client.Submit(b.ctx(), req("task-fp5", "device-2"), "") // the crash may beat the answer
	require.Equal(t, 137, b.ctl.ExitCode())
	b.ctl.Restart()
	op, status, err := b.client.Submit(b.ctx(), req("task-fp5", "device-2"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "committed before the crash")
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	b.verify()
}

// A receipt is acknowledged only after its commit: a controller that dies
// between the two leaves it with the broker, which delivers it again after
// the restart. The device cannot answer queries and publishes its
// succeeded receipt exactly once, so only the redelivery can finish the
// operation (with the PUBACK sent on arrival, as before, it timed out).
func TestReceiptUncommittedAtACrashIsDeliveredAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{devices: 1})
	h := newHandDeviceWith(t, b, "hand-ack", `{"dedupe":true,"query":false}`)
	op, _, err := b.client.Submit(b.ctx(), req("task-ack", "hand-ack"), "")
	require.NoError(t, err)
	cmd := h.nextCommand()
	h.receipt(cmd, "received", 1, "")
	h.receipt(cmd, "executing", 2, "")
	eventually(t, "executing committed", 10*time.Second, func() bool { return b.command(cmd.CommandID).Status == "executing" })

	b.ctl.Kill()
	b.ctl.Restart("CONTROLLER_FAILPOINTS=before-receipt-commit=1*crash")
	h.receipt(cmd, "succeeded", 3, "") // the one and only succeeded receipt
	require.Equal(t, 137, b.ctl.ExitCode(), "died with the receipt decoded, uncommitted and unacknowledged")

	b.ctl.Restart()
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status, "the broker delivered the receipt again")
	// Counted with its commit, before the fact that answers the ?wait=.
	require.Equal(t, 1.0, b.metric(`controller_receipts_total{effect="applied"}`), "applied once, by the restarted process")
	b.verify()
}

func TestUnknownFailpointRefusesToStart(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.ctl.Kill()
	for _, spec := range []string{"no-such-point=crash", "before-publish=explode"} {
		c := startRaw(t, b, "CONTROLLER_FAILPOINTS="+spec)
		require.Equal(t, 1, c.ExitCode(), spec)
		require.True(t, strings.Contains(c.Output(), "failpoint"), c.Output())
	}
}

func TestSecondInstanceWithSameIDRefused(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be})
		c := startRaw(t, b)
		require.Equal(t, 1, c.ExitCode())
		require.Contains(t, c.Output(), "already running")
		// After a kill -9 of the first, a restart starts at once.
		b.ctl.Kill()
		start := time.Now()
		b.ctl.Restart()
		require.Less(t, time.Since(start), 10*time.Second)
	})
}

// TestFailpointBeforeDeviceListMove (SQLite, whose lists by device take new
// rows in bulk): with every move failing, submits and their receipts commit
// all the same and the lists by device hold every operation, its rows
// pending; a crash at the move leaves them pending; the next instance moves
// them with its first batch, and the lists read the same throughout.
func TestFailpointBeforeDeviceListMove(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{backend: "sqlite", env: []string{"CONTROLLER_FAILPOINTS=before-device-list-move=error"}})
	require.Contains(t, b.ctl.Output(), "failpoint armed: before-device-list-move=error")
	hits := func() float64 { return b.metric(`controller_failpoint_hits_total{name="before-device-list-move"}`) }
	// Moves run at most twice a second, with a batch: submit until three
	// were tried, the last of them after the first operation existed.
	var ids []string
	for i := 0; len(ids) < 3 || hits() < 3; i++ {
		require.Less(t, i, 300, "three moves within 300 operations")
		op, status, err := b.client.Submit(b.ctx(), req(fmt.Sprintf("task-lm%d", i), "device-1"), "")
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status, "the failed move took nothing with it")
		ids = append([]string{op.OperationID}, ids...) // newest first
	}
	pending := func() string {
		return strings.Join(b.rows(`SELECT (SELECT count(*) FROM operations WHERE device_listed = 0),
			(SELECT count(*) FROM commands WHERE device_listed = 0)`), "")
	}
	all := fmt.Sprintf("%d|%d", len(ids), len(ids))
	require.Equal(t, all, pending(), "no move stood: every row waits")
	listed := func(c *client.Client) []string {
		ops, err := c.ListOperations(b.ctx(), client.OperationQuery{Device: "device-1", Limit: 7})
		require.NoError(t, err)
		var out []string
		for _, op := range ops {
			out = append(out, op.OperationID)
		}
		cmds, err := c.ListCommands(b.ctx(), client.CommandQuery{Device: "device-1"})
		require.NoError(t, err)
		require.Len(t, cmds, len(ids))
		return out
	}
	require.Equal(t, ids, listed(b.client), "the lists by device read the pending rows")

	// A crash at the move: the next start's first batch moves first.
	b.ctl.Kill()
	crashing := startRaw(t, b, "CONTROLLER_FAILPOINTS=before-device-list-move=1*crash")
	require.Equal(t, 137, crashing.ExitCode(), "it crashed at the move:\n%s", crashing.Output())
	require.Equal(t, all, pending(), "the crash left them pending")

	b.ctl.Restart() // no failpoints
	deadline := time.Now().Add(10 * time.Second)
	for pending() != "0|0" {
		require.True(t, time.Now().Before(deadline), "moved by the instance's first batch: %s pending", pending())
		<-time.After(20 * time.Millisecond) // poll interval of a deadline-bounded wait
	}
	require.Equal(t, ids, listed(b.client), "the same lists once moved")
	b.verify()
}
