package e2e

import (
	"fmt"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

func (b *bundle) command(id string) apiwire.Command {
	b.t.Helper()
	c, err := b.client.Command(b.ctx(), id)
	require.NoError(b.t, err)
	return c
}

func (b *bundle) waitCommand(id, status string) apiwire.Command {
	b.t.Helper()
	var c apiwire.Command
	eventually(b.t, "command "+id+" "+status, 30*time.Second, func() bool {
		c = b.command(id)
		return c.Status == status
	})
	return c
}

// waitDevice waits until the controller shows the device online, or
// offline. Offline must be a presence the controller applied (the device was
// seen), never the default of a device it has not heard of yet.
func (b *bundle) waitDevice(id string, online bool) {
	b.t.Helper()
	eventually(b.t, fmt.Sprintf("%s online=%v", id, online), 30*time.Second, func() bool {
		d, err := b.client.Device(b.ctx(), id)
		return err == nil && d.Seen && d.Online == online
	})
}

func TestLostResponseIsAskedAboutNotResent(t *testing.T) {
	t.Parallel()
	// device-1 executes but its received, executing and succeeded receipts are all lost.
	b := setup(t, setupOpts{faults: sim.Profile{Devices: []sim.Override{{Match: "device-1",
		Faults: sim.Faults{DropReceipt: sim.ReceiptFault{Trigger: sim.Trigger{Count: 3}}}}}}})
	sn := sniff(t, b.broker.URL())
	op, _, err := b.client.Submit(b.ctx(), req("lost-resp", "device-1"), "")
	require.NoError(t, err)
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "succeeded", final.Status)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	require.Equal(t, []string{op.CommandID}, final.CommandIDs, "no second command_id in the store")
	cmds, queries := sn.of(op.OperationID)
	require.Equal(t, map[string]bool{op.CommandID: true}, commandIDs(cmds), "no second command_id on the wire")
	require.NotEmpty(t, queries)
	for _, q := range queries {
		require.Equal(t, op.CommandID, q.CommandID, "asked about the same command_id")
	}
	cmd := b.command(op.CommandID)
	t.Logf("lost response: %d queries, %d publishes of the command, 1 execution", cmd.Queries, cmd.Attempt)
	b.verify()
}

func TestLostCommandIsResentWithTheSameID(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{faults: sim.Profile{Devices: []sim.Override{{Match: "device-2",
		Faults: sim.Faults{DropCommand: sim.Trigger{Count: 1}}}}}})
	sn := sniff(t, b.broker.URL())
	op, _, err := b.client.Submit(b.ctx(), req("lost-cmd", "device-2"), "")
	require.NoError(t, err)
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	cmd := b.command(op.CommandID)
	require.Equal(t, 2, cmd.Attempt, "published twice, the same command")
	cmds, _ := sn.of(op.OperationID)
	require.Len(t, cmds, 2)
	require.Equal(t, map[string]bool{op.CommandID: true}, commandIDs(cmds))
	require.Equal(t, 1, cmds[0].cmd.Attempt)
	require.Equal(t, 2, cmds[1].cmd.Attempt)
	t.Logf("lost command: %d queries, %d publishes, 1 execution", cmd.Queries, cmd.Attempt)
	b.verify()
}

func TestOfflineAtDispatchWaits(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	sn := sniff(t, b.broker.URL())
	b.fleet.Device("device-3").DropConnection(0)
	b.waitDevice("device-3", false)
	op, _, err := b.client.Submit(b.ctx(), req("offline", "device-3"), "")
	require.NoError(t, err)
	b.waitCommand(op.CommandID, "waiting_device")
	cmds, _ := sn.of(op.OperationID)
	require.Empty(t, cmds, "nothing published to an offline device")

	b.fleet.Device("device-3").Reconnect()
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	require.Equal(t, 1, b.command(op.CommandID).Attempt)
	b.verify()
}

func TestOfflinePastTTLTimesOutThenRetrySucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{args: []string{"--command-ttl", "2s"}})
	b.fleet.Device("device-1").DropConnection(0)
	b.waitDevice("device-1", false)
	op, _, err := b.client.Submit(b.ctx(), req("offline-ttl", "device-1"), "")
	require.NoError(t, err)
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "failed_retryable", final.Status)
	require.Equal(t, "timeout", b.command(op.CommandID).Status)
	require.Empty(t, b.executions())

	b.fleet.Device("device-1").Reconnect()
	b.waitDevice("device-1", true)
	again, status, err := b.client.Submit(b.ctx(), req("offline-ttl", "device-1"), "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "the same POST is the retry")
	require.Equal(t, "started", again.Status)
	done := b.waitFinal(op.OperationID)
	require.Equal(t, "succeeded", done.Status)
	require.Len(t, done.CommandIDs, 2, "never published, so a new command_id")
	require.Equal(t, 2, done.Attempt)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	b.verify()
}

func TestOfflinePolicyFail(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{args: []string{"--offline", "fail"}})
	b.fleet.Device("device-2").DropConnection(0)
	b.waitDevice("device-2", false)
	op, _, err := b.client.Submit(b.ctx(), req("offline-fail", "device-2"), "")
	require.NoError(t, err)
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "failed_retryable", final.Status)
	cmd := b.command(op.CommandID)
	require.Equal(t, "failed", cmd.Status)
	require.Equal(t, "device_offline", cmd.Reason)
	require.Zero(t, cmd.Attempt)
	b.verify()
}

func TestConnectionDroppedMidExecution(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{faults: sim.Profile{Devices: []sim.Override{{Match: "device-1", Faults: sim.Faults{
		SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(1500 * time.Millisecond)},
		DropReceipt:   sim.ReceiptFault{Trigger: sim.Trigger{Count: 1}, Statuses: []string{sim.ClassFinal}},
	}}}}})
	op, _, err := b.client.Submit(b.ctx(), req("mid-exec", "device-1"), "")
	require.NoError(t, err)
	b.waitCommand(op.CommandID, "executing")
	session := b.fleet.Device("device-1").Session()
	b.fleet.Device("device-1").DropConnection(0) // the broker fires the LWT after the keepalive
	b.waitCommand(op.CommandID, "waiting_device")
	eventually(t, "executed while offline", 20*time.Second, func() bool { return b.executions()[op.OperationID] == 1 })
	b.fleet.Device("device-1").Reconnect()
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	require.Greater(t, b.fleet.Device("device-1").Session(), session, "back with a new session")
	cmd := b.command(op.CommandID)
	require.Equal(t, 1, cmd.Attempt, "learned by asking, not re-sent")
	require.GreaterOrEqual(t, cmd.Queries, 1)
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	b.verify()
}

func TestFinalReceiptLostAcrossBrokerRestartFoundByReconcile(t *testing.T) {
	t.Parallel()
	// A long ack timeout: only the ask-after-reconnect can find the outcome in time.
	b := setup(t, setupOpts{args: []string{"--ack-timeout", "60s"}, faults: sim.Profile{Devices: []sim.Override{{Match: "device-2",
		Faults: sim.Faults{DropReceipt: sim.ReceiptFault{Trigger: sim.Trigger{Count: 1}, Statuses: []string{sim.ClassFinal}}}}}}})
	op, _, err := b.client.Submit(b.ctx(), req("reconcile", "device-2"), "")
	require.NoError(t, err)
	eventually(t, "executed", 20*time.Second, func() bool { return b.executions()[op.OperationID] == 1 })
	before := b.metric("controller_reconciles_total")
	start := time.Now()
	b.broker.Restart(false)
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	t.Logf("found by the ask-after-reconnect %s after the broker restart", time.Since(start).Round(time.Millisecond))
	require.Less(t, time.Since(start), 60*time.Second)
	require.Greater(t, b.metric("controller_reconciles_total"), before)
	require.Equal(t, 1, b.command(op.CommandID).Attempt)
}

func TestLegacyDeviceNeedsAttentionThenResolve(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{args: []string{"--ack-timeout", "300ms", "--max-attempts", "2"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-3", Faults: sim.Faults{
			Legacy:        sim.Legacy{Enabled: true, Dedupe: false, Query: true},
			DropReceipt:   sim.ReceiptFault{Trigger: sim.Trigger{P: 1}, Statuses: []string{sim.ClassFinal}},
			IgnoreQueries: sim.Trigger{P: 1},
		}}}}})
	eventually(t, "legacy capabilities seen", 10*time.Second, func() bool {
		d, err := b.client.Device(b.ctx(), "device-3")
		return err == nil && d.Seen && !d.Capabilities.Dedupe
	})
	sn := sniff(t, b.broker.URL())
	op, _, err := b.client.Submit(b.ctx(), req("legacy", "device-3"), "")
	require.NoError(t, err)
	cmd := b.waitCommand(op.CommandID, "needs_attention")
	require.Equal(t, 1, cmd.Attempt, "published once")
	require.Equal(t, 0, cmd.QoS)
	cmds, queries := sn.of(op.OperationID)
	require.Len(t, cmds, 1, "never re-sent")
	require.Equal(t, byte(0), cmds[0].qos)
	require.Len(t, queries, 2, "asked max_attempts times")
	opNow, err := b.client.Operation(b.ctx(), op.OperationID, 0)
	require.NoError(t, err)
	require.Equal(t, "started", opNow.Status, "the operation waits for the resolve")

	resolved, err := b.client.Resolve(b.ctx(), op.CommandID, "succeeded", "checked on site: it restarted")
	require.NoError(t, err)
	require.Equal(t, "succeeded", resolved.Status)
	require.Equal(t, "anonymous", resolved.ResolvedBy)
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status)
	again, err := b.client.Resolve(b.ctx(), op.CommandID, "succeeded", "again")
	require.NoError(t, err, "an exact replay")
	require.Equal(t, "succeeded", again.Status)
	_, err = b.client.Resolve(b.ctx(), op.CommandID, "failed", "changed my mind")
	require.Equal(t, "illegal_state", client.Code(err))
	cmds, _ = sn.of(op.OperationID)
	require.Len(t, cmds, 1)
	require.Equal(t, 1, b.executions()[op.OperationID])
	b.verify()
}

func TestLateSuccessAfterTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{args: []string{"--command-ttl", "2s", "--ack-timeout", "500ms"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-1", Faults: sim.Faults{
			SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(3500 * time.Millisecond)}}}}}})
	op, _, err := b.client.Submit(b.ctx(), req("late", "device-1"), "")
	require.NoError(t, err)
	cmd := b.waitCommand(op.CommandID, "timeout")
	opNow, err := b.client.Operation(b.ctx(), op.OperationID, 0)
	require.NoError(t, err)
	require.Equal(t, "failed_retryable", opNow.Status)
	eventually(t, "late outcome", 20*time.Second, func() bool {
		cmd = b.command(op.CommandID)
		return cmd.LateOutcome != ""
	})
	require.Equal(t, "timeout", cmd.Status, "the terminal state is never rewritten")
	require.Equal(t, "succeeded", cmd.LateOutcome)
	require.NotEmpty(t, string(cmd.LateResult))
	require.Equal(t, "succeeded", b.waitFinal(op.OperationID).Status, "the late success decides the operation")
	require.GreaterOrEqual(t, b.metric("controller_late_outcomes_total"), 1.0)
	require.Equal(t, 1, b.executions()[op.OperationID])
	b.verify()
}

func TestSilentDeviceGetsAtMostMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{args: []string{"--ack-timeout", "200ms", "--max-attempts", "3", "--command-ttl", "4s"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{
			DropCommand: sim.Trigger{P: 1}, IgnoreQueries: sim.Trigger{P: 1}}}}}})
	sn := sniff(t, b.broker.URL())
	op, _, err := b.client.Submit(b.ctx(), req("silent", "device-2"), "")
	require.NoError(t, err)
	cmd := b.waitCommand(op.CommandID, "timeout")
	require.Equal(t, 3, cmd.Attempt)
	require.LessOrEqual(t, cmd.Queries, 3)
	cmds, queries := sn.of(op.OperationID)
	require.Len(t, cmds, 3, "at most max_attempts sends")
	require.LessOrEqual(t, len(queries), 3)
	require.Equal(t, "failed_retryable", b.waitFinal(op.OperationID).Status)
	require.Empty(t, b.executions())
	t.Logf("silent device: %d sends, %d queries, then timeout", len(cmds), len(queries))
}

func TestStalePresenceChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.waitDevice("device-1", true)
	d, err := b.client.Device(b.ctx(), "device-1")
	require.NoError(t, err)
	raw := rawClient(t, b.broker.URL(), "tester-presence")
	// A delayed LWT of an older connection.
	publish(t, raw, "fleet/device-1/presence", fmt.Sprintf(`{"online":false,"session":%d}`, d.Session-1))
	// Wait until the controller has seen a later message, then check.
	publish(t, raw, "fleet/device-9/presence", `{"online":true,"session":1,"capabilities":{"dedupe":true,"query":true}}`)
	b.waitDevice("device-9", true)
	d2, _ := b.client.Device(b.ctx(), "device-1")
	require.True(t, d2.Online, "a stale LWT changes nothing")
	require.Equal(t, d.Session, d2.Session)

	// An offline of the current session is applied; a stale online of that session after it is not.
	publish(t, raw, "fleet/device-1/presence", fmt.Sprintf(`{"online":false,"session":%d}`, d.Session))
	b.waitDevice("device-1", false)
	publish(t, raw, "fleet/device-1/presence", fmt.Sprintf(`{"online":true,"session":%d,"capabilities":{"dedupe":true,"query":true}}`, d.Session))
	publish(t, raw, "fleet/device-9/presence", `{"online":false,"session":1}`)
	b.waitDevice("device-9", false)
	d3, _ := b.client.Device(b.ctx(), "device-1")
	require.False(t, d3.Online)
	// Counted after the commit the waits above see, so waited for too.
	eventually(t, "both stale messages counted", 10*time.Second, func() bool {
		return b.metric(`controller_presence_total{effect="stale"}`) >= 2
	})
	d4, _ := b.client.Device(b.ctx(), "device-1")
	require.False(t, d4.Online, "the stale online, now certainly handled, changed nothing")
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.fleet.Device("device-2").DropConnection(0)
	b.waitDevice("device-2", false)
	op, _, err := b.client.Submit(b.ctx(), req("cancel", "device-2"), "")
	require.NoError(t, err)
	b.waitCommand(op.CommandID, "waiting_device")
	c, err := b.client.Cancel(b.ctx(), op.CommandID)
	require.NoError(t, err)
	require.Equal(t, "cancelled", c.Status)
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "failed_final", final.Status)
	require.Equal(t, "cancelled", final.Reason)
	_, err = b.client.Cancel(b.ctx(), op.CommandID)
	require.NoError(t, err, "cancel again: a replay")

	b.fleet.Device("device-2").Reconnect()
	op2, _, err := b.client.Submit(b.ctx(), req("cancel-late", "device-2"), "")
	require.NoError(t, err)
	b.waitFinal(op2.OperationID)
	_, err = b.client.Cancel(b.ctx(), op2.CommandID)
	require.Equal(t, "already_published", client.Code(err))
	_, err = b.client.Cancel(b.ctx(), "c-nope")
	require.Equal(t, "not_found", client.Code(err))
	require.Empty(t, b.executions()[op.OperationID])
}

func TestTimeToDetectOffline(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// A closed TCP connection (the sim's abrupt drop, a crashed process): the
	// broker notices at once and publishes the LWT.
	b.waitDevice("device-1", true)
	start := time.Now()
	b.fleet.Device("device-1").DropConnection(0)
	b.waitDevice("device-1", false)
	closed := time.Since(start)

	// A silent device (SIGSTOP: the connection stays open, nothing flows):
	// only the keepalive finds it, after 1.5 times the keepalive.
	sim := exec.Command(testenv.Binary(t, "devicesim"), "run", "--mqtt", b.broker.URL(), "--devices", "1",
		"--id-prefix", "silent-", "--state-dir", t.TempDir(), "--keepalive", "5s")
	testenv.StartProcess(t, sim)
	b.waitDevice("silent-1", true)
	require.NoError(t, sim.Process.Signal(syscall.SIGSTOP))
	start = time.Now()
	b.waitDevice("silent-1", false)
	silent := time.Since(start)
	t.Logf("time to show a device offline: connection closed %s; silent with keepalive 5s %s",
		closed.Round(time.Millisecond), silent.Round(time.Millisecond))
	require.Less(t, closed, 5*time.Second)
	require.Greater(t, silent, 4*time.Second, "a silent device is only found by the keepalive")
	require.Less(t, silent, 15*time.Second)
}
