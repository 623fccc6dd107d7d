package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// peer starts another controller instance on b's database and broker.
func (b *bundle) peer(id string, env []string, args ...string) (*testenv.Controller, *client.Client) {
	c := testenv.StartController(b.t, testenv.ControllerOpts{DB: b.db, MQTT: b.broker.URL(), InstanceID: id, Env: env,
		Args: append([]string{"--ack-timeout", "1s", "--sweep-interval", "100ms"}, args...)})
	return c, client.New(c.URL, "")
}

func TestStalledPublisherIsFencedDedupeDevice(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		// Instance i1 stalls between its committed pending → sent and the publish,
		// longer than its lease, and its heartbeat stalls too; i2 takes over,
		// asks, and re-sends the same command.
		b := setup(t, setupOpts{backend: be, env: []string{"CONTROLLER_FAILPOINTS=before-publish=1*sleep(6s);before-lease-renew=1*sleep(6s)"},
			args: []string{"--lease-ttl", "2s"}})
		sn := sniff(t, b.broker.URL())
		b.peer("i2", nil, "--lease-ttl", "2s")
		op, _, err := b.client.Submit(b.ctx(), req("stall", "device-1"), "")
		require.NoError(t, err)
		final := b.waitFinal(op.OperationID)
		require.Equal(t, "succeeded", final.Status)
		require.Equal(t, "i2", final.Owner, "the survivor finished it")
		eventually(t, "i1 wakes and drops its publish", 15*time.Second, func() bool {
			return b.metric("controller_fencing_refused_total") >= 1
		})
		require.Zero(t, b.metric(`controller_publishes_total{kind="command"}`), "nothing i1 did reached a device")
		cmds, _ := sn.of(op.OperationID)
		require.Len(t, cmds, 1, "one publication on the wire: i2's re-send")
		require.Equal(t, 2, cmds[0].cmd.Attempt)
		require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
		b.verify()
	})
}

// A publish decision committed while the lease was still valid, but acted
// on only once it had entered the trust margin (a stall of 1.8 s against a
// ttl of 2 s and a margin of 400 ms), is dropped and rechecked at the end of
// the margin: the holder, its lease renewed meanwhile, asks the device and
// re-sends the same command within seconds, not after the ack timeout of
// 30 s that the dropped decision had set as its next check.
func TestPublishDroppedOutsideTheTrustWindowIsRecheckedSoon(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be, env: []string{"CONTROLLER_FAILPOINTS=before-publish=1*sleep(1800ms)"},
			args: []string{"--lease-ttl", "2s", "--ack-timeout", "30s"}})
		sn := sniff(t, b.broker.URL())
		start := time.Now()
		op, _, err := b.client.Submit(b.ctx(), req("trust-drop", "device-1"), "")
		require.NoError(t, err)
		final := b.waitFinal(op.OperationID)
		took := time.Since(start)
		require.Equal(t, "succeeded", final.Status)
		require.Equal(t, "i1", final.Owner, "the holder itself, its lease renewed")
		require.Less(t, took, 15*time.Second, "the dropped decision waited for its back-off")
		require.GreaterOrEqual(t, b.metric("controller_fencing_refused_total"), 1.0)
		require.Contains(t, b.ctl.Output(), "publish dropped: lease outside its trust window")
		cmds, queries := sn.of(op.OperationID)
		require.Len(t, cmds, 1, "only the re-send reached the wire")
		require.Equal(t, op.CommandID, cmds[0].cmd.CommandID, "the same command_id")
		require.Equal(t, 2, cmds[0].cmd.Attempt)
		require.NotEmpty(t, queries, "the device was asked before the re-send")
		require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
		t.Logf("submit to succeeded with one publish dropped for the trust window: %s (ack timeout 30s)", took.Round(time.Millisecond))
		b.verify()
	})
}

func TestStalledPublisherIsFencedLegacyDevice(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be, env: []string{"CONTROLLER_FAILPOINTS=before-publish=1*sleep(6s)"}, args: []string{"--lease-ttl", "2s", "--max-attempts", "2"},
			faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{Legacy: sim.Legacy{Enabled: true, Query: true}}}}}})
		eventually(t, "legacy capabilities seen", 10*time.Second, func() bool {
			d, err := b.client.Device(b.ctx(), "device-2")
			return err == nil && d.Seen && !d.Capabilities.Dedupe
		})
		sn := sniff(t, b.broker.URL())
		_, c2 := b.peer("i2", nil, "--lease-ttl", "2s", "--max-attempts", "2", "--ack-timeout", "300ms")
		op, _, err := b.client.Submit(b.ctx(), req("stall-legacy", "device-2"), "")
		require.NoError(t, err)
		cmd := b.waitCommand(op.CommandID, "needs_attention")
		require.Equal(t, 1, cmd.Attempt, "the one committed publish decision, by i1")
		eventually(t, "i1 wakes and drops its publish", 15*time.Second, func() bool {
			return b.metric("controller_fencing_refused_total") >= 1
		})
		cmds, queries := sn.of(op.OperationID)
		require.Empty(t, cmds, "not even one publication: i1 lost its lease, i2 never re-sends to a legacy device")
		require.NotEmpty(t, queries, "i2 asked")
		require.Empty(t, b.executions())
		require.Zero(t, metricAt(t, c2.Server, `controller_publishes_total{kind="command"}`))
		b.verify()
	})
}

func TestSIGSTOPPedHolderIsTakenOver(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be, args: []string{"--lease-ttl", "2s"},
			faults: sim.Profile{Devices: []sim.Override{{Match: "device-3", Faults: sim.Faults{DropCommand: sim.Trigger{Count: 1}}}}}})
		c2, cl2 := b.peer("i2", nil, "--lease-ttl", "2s")
		op, _, err := b.client.Submit(b.ctx(), req("sigstop", "device-3"), "")
		require.NoError(t, err)
		eventually(t, "published once", 10*time.Second, func() bool { return b.command(op.CommandID).Attempt == 1 })
		before := b.metric(`controller_publishes_total{kind="command"}`)
		sn := sniff(t, b.broker.URL())
		b.ctl.Signal(syscall.SIGSTOP)
		stopped := time.Now()
		final, err := cl2.Operation(b.ctx(), op.OperationID, 30*time.Second)
		require.NoError(t, err)
		require.Equal(t, "succeeded", final.Status)
		require.Equal(t, "i2", final.Owner)
		t.Logf("SIGSTOP to finished by the survivor: %s (lease ttl 2s)", time.Since(stopped).Round(time.Millisecond))
		require.GreaterOrEqual(t, metricAt(t, c2.URL, "controller_takeovers_total"), 1.0)

		b.ctl.Signal(syscall.SIGCONT)
		// Let i1 run its sweeps and heartbeats for a few lease periods.
		op2, _, err := cl2.Submit(b.ctx(), req("sigstop-after", "device-3"), "")
		require.NoError(t, err)
		require.Equal(t, "succeeded", b.waitFinal(op2.OperationID).Status)
		eventually(t, "i1 serving again", 10*time.Second, func() bool {
			_, err := b.client.Operation(b.ctx(), op.OperationID, 0)
			return err == nil
		})
		// Nothing i1 decided after the SIGSTOP reached a device. One publish
		// may: a stop that lands between the trust check and the publish of
		// a decision taken before it sends that decision after SIGCONT, the
		// same command_id and attempt, which the device deduplicates (the
		// residual window of any lease without a device-side fence).
		late := b.metric(`controller_publishes_total{kind="command"}`) - before
		require.LessOrEqual(t, late, 1.0, "i1 published after SIGCONT more than the one decision in flight")
		cmds, _ := sn.of(op.OperationID)
		for _, c := range cmds {
			require.Equal(t, op.CommandID, c.cmd.CommandID, "one command_id for the operation")
		}
		require.Equal(t, map[string]int{op.OperationID: 1, op2.OperationID: 1}, b.executions())
		b.verify()
	})
}

func TestStalledHeartbeatLosesItsLeases(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be, env: []string{"CONTROLLER_FAILPOINTS=before-lease-renew=sleep(4s)"}, args: []string{"--lease-ttl", "2s"},
			faults: sim.Profile{Devices: []sim.Override{{Match: "device-1", Faults: sim.Faults{
				SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(3 * time.Second)},
				DropReceipt:   sim.ReceiptFault{Trigger: sim.Trigger{Count: 1}, Statuses: []string{sim.ClassFinal}}}}}}})
		_, cl2 := b.peer("i2", nil, "--lease-ttl", "2s")
		op, _, err := b.client.Submit(b.ctx(), req("renew-stall", "device-1"), "")
		require.NoError(t, err)
		final, err := cl2.Operation(b.ctx(), op.OperationID, 30*time.Second)
		require.NoError(t, err)
		require.Equal(t, "succeeded", final.Status)
		require.Equal(t, "i2", final.Owner, "i1's heartbeat stalled: i2 took over and asked")
		require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
		require.Len(t, final.CommandIDs, 1)
		b.verify()
	})
}

func TestTwoInstancesRaceOnTheSameOperations(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be, devices: 10})
		_, cl2 := b.peer("i2", nil)
		const n = 50
		var wg sync.WaitGroup
		errs := make(chan error, 2*n)
		for i := 0; i < n; i++ {
			for _, c := range []*client.Client{b.client, cl2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// A 503 is an answer the contract allows (a batch that lost
					// a deadlock to the other instance's five times): the
					// caller retries with the same operation_id.
					r := req(fmt.Sprintf("race-%d", i), fmt.Sprintf("device-%d", i%10+1))
					var err error
					for try := 0; try < 20; try++ {
						var status int
						if _, status, err = c.Submit(b.ctx(), r, ""); status != http.StatusServiceUnavailable {
							break
						}
						<-time.After(100 * time.Millisecond) // Retry-After, shortened
					}
					errs <- err
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		owners := map[string]int{}
		for i := 0; i < n; i++ {
			op := b.waitFinal(fmt.Sprintf("race-%d:restart:device-%d:v1", i, i%10+1))
			require.Equal(t, "succeeded", op.Status)
			require.Len(t, op.CommandIDs, 1)
			owners[op.Owner]++
		}
		t.Logf("owners: %v", owners)
		require.Equal(t, []string{fmt.Sprint(n)}, b.rows(`SELECT COUNT(*) FROM commands`))
		ex := b.executions()
		require.Len(t, ex, n)
		for id, k := range ex {
			require.Equal(t, 1, k, id)
		}
		b.verify()
	})
}

// A lone instance whose heartbeat stalls past its lease ttl (here the
// before-lease-renew failpoint sleeps 8 s, the ttl is 2 s) holds leases that
// ran out and that no heartbeat can revive, and there is no peer to take
// them: once they have been expired for a ttl more it takes them over
// itself, with new tokens, and asks about the command it could not decide
// about meanwhile. Before, the operation stayed started for good (until a
// restart reclaimed it): a starved host stalled one kill -9 test for 45 s.
func TestLoneInstanceTakesBackItsExpiredLeases(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{env: []string{"CONTROLLER_FAILPOINTS=before-lease-renew=1*sleep(8s)"},
		args: []string{"--lease-ttl", "2s", "--ack-timeout", "3s"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-1", Faults: sim.Faults{
			DropCommand: sim.Trigger{Count: 1}}}}}})
	op, _, err := b.client.Submit(b.ctx(), req("lone-stall", "device-1"), "")
	require.NoError(t, err)
	final := b.waitFinal(op.OperationID)
	require.Equal(t, "succeeded", final.Status)
	require.Equal(t, "i1", final.Owner)
	require.GreaterOrEqual(t, b.metric("controller_takeovers_total"), 1.0, "it took its own expired lease")
	require.Equal(t, map[string]int{op.OperationID: 1}, b.executions())
	require.Len(t, final.CommandIDs, 1, "the same command_id, asked about, then re-sent")
	b.verify()
}
