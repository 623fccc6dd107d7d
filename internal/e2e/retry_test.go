package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/sim"
)

// The retry of a failed_retryable operation asks about its last command
// first: the device answers succeeded, so the retry adopts it and no new
// command_id is minted.
func TestRetryAdoptsTheLastCommandWhenItRan(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{args: []string{"--command-ttl", "2s", "--ack-timeout", "300ms", "--max-attempts", "2"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-1", Faults: sim.Faults{
			// Executes, but every receipt and answer is lost until the retry.
			DropReceipt: sim.ReceiptFault{Trigger: sim.Trigger{P: 1}}}}}}})
	op, _, err := b.client.Submit(b.ctx(), req("retry-adopt", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, "failed_retryable", b.waitFinal(op.OperationID).Status)
	require.Equal(t, "timeout", b.command(op.CommandID).Status)
	require.Equal(t, 1, b.executions()[op.OperationID], "it did run")

	require.NoError(t, b.fleet.Device("device-1").SetFaults(sim.Faults{}))
	_, status, err := b.client.Submit(b.ctx(), req("retry-adopt", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "succeeded", final.Status)
	require.Equal(t, []string{op.CommandID}, final.CommandIDs, "adopted: no new command_id")
	cmd := b.command(op.CommandID)
	require.Equal(t, "timeout", cmd.Status, "the terminal state is kept")
	require.Equal(t, "succeeded", cmd.LateOutcome)
	require.Equal(t, 1, b.executions()[op.OperationID])
	b.verify()
}

// The device never saw the last command: it answers unknown, so the retry
// mints a new command_id, which runs once.
func TestRetryMintsANewCommandWhenTheDeviceNeverSawIt(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{args: []string{"--command-ttl", "2s", "--ack-timeout", "300ms", "--max-attempts", "2"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{DropCommand: sim.Trigger{P: 1}}}}}})
	op, _, err := b.client.Submit(b.ctx(), req("retry-mint", "device-2"), "")
	require.NoError(t, err)
	require.Equal(t, "failed_retryable", b.waitFinal(op.OperationID).Status)
	require.Equal(t, 2, b.command(op.CommandID).Attempt, "max_attempts sends, all lost")
	require.Empty(t, b.executions())

	require.NoError(t, b.fleet.Device("device-2").SetFaults(sim.Faults{}))
	start := time.Now()
	_, status, err := b.client.Submit(b.ctx(), req("retry-mint", "device-2"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "succeeded", final.Status)
	require.Len(t, final.CommandIDs, 2, "asked, heard unknown, minted a new command_id")
	require.Equal(t, op.CommandID, final.CommandIDs[0])
	require.GreaterOrEqual(t, b.command(op.CommandID).Queries, 1)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	t.Logf("retry: asked, unknown, new command, succeeded in %s", time.Since(start).Round(time.Millisecond))
	b.verify()
}
