package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/sim"
)

// Window 1: the request never reaches the service (it is down); the caller
// retries with the same operation_id once it is back: one operation, one
// execution.
func TestRequestNeverReachesTheService(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.ctl.Kill()
	_, _, err := b.client.Submit(b.ctx(), req("unreached", "device-1"), "")
	require.Error(t, err)
	require.Empty(t, client.Code(err), "no answer at all: %v", err)
	b.ctl.Restart()
	op, status, err := b.client.Submit(b.ctx(), req("unreached", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, "the first request never arrived: this one creates it")
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	b.verify()
}

// Window 6: started, then the controller crashes for good: a peer takes the
// lease over when it runs out, asks the device, and finishes.
func TestCrashedHolderIsTakenOver(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be, args: []string{"--lease-ttl", "2s"},
			faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{
				SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(time.Second)},
				DropReceipt:   sim.ReceiptFault{Trigger: sim.Trigger{Count: 1}, Statuses: []string{sim.ClassFinal}}}}}}})
		_, cl2 := b.peer("i2", nil, "--lease-ttl", "2s")
		op, _, err := b.client.Submit(b.ctx(), req("crashed-holder", "device-2"), "")
		require.NoError(t, err)
		b.waitCommand(op.CommandID, "executing")
		b.ctl.Kill() // for good
		start := time.Now()
		final, err := cl2.Operation(b.ctx(), op.OperationID, 30*time.Second)
		require.NoError(t, err)
		require.Equal(t, "succeeded", final.Status)
		require.Equal(t, "i2", final.Owner)
		require.Equal(t, []string{op.CommandID}, final.CommandIDs, "asked about the same command_id, no new one")
		t.Logf("holder killed to finished by the survivor: %s (lease ttl 2s)", time.Since(start).Round(time.Millisecond))
		require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
		b.verify()
	})
}
